#include "config/fsdp/accelerate_config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <map>
#include <span>
#include <utility>

#include "config/did_you_mean.h"
#include "zero/base/error.h"

namespace zero::config::fsdp {

namespace {

// Indexed by the enums' values (accelerate/utils/constants.py lists them in the same order).
constexpr std::array<std::string_view, 5> kShardingNames = {
    "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};
constexpr std::array<std::string_view, 3> kPrefetchNames = {"BACKWARD_PRE", "BACKWARD_POST",
                                                            "NO_PREFETCH"};
constexpr std::array<std::string_view, 3> kStateDictNames = {"FULL_STATE_DICT", "LOCAL_STATE_DICT",
                                                             "SHARDED_STATE_DICT"};
constexpr std::array<std::string_view, 3> kWrapNames = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP",
                                                        "NO_WRAP"};
constexpr std::array<std::string_view, 4> kPrecisionNames = {"no", "fp16", "bf16", "fp8"};

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

ConfigError located(const YAML::Exception& e) {
  return ConfigError(
      "", fmt::format("line {}, column {}: {}", e.mark.line + 1, e.mark.column + 1, e.msg));
}

std::string key_of(const YAML::Node& key) {
  if (!key.IsScalar()) throw YAML::Exception(key.Mark(), "a key that is not a plain name");
  return key.Scalar();
}

std::string list_of(std::span<const std::string_view> names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    out += i == 0 ? "" : (i + 1 == names.size() ? " or " : ", ");
    out += names[i];
  }
  return out;
}

// Collects every problem of one document, then throws them together.
class Reader {
 public:
  void error(std::string path, std::string message) {
    problems_.push_back({std::move(path), std::move(message)});
  }
  void throw_if_any() {
    if (!problems_.empty()) throw ConfigError(std::move(problems_));
  }

  std::optional<bool> boolean(const YAML::Node& n, const std::string& path) {
    // PyYAML (which Accelerate reads with) takes these YAML 1.1 spellings as booleans.
    const std::string v = n.IsScalar() ? upper(n.Scalar()) : "";
    if (v == "TRUE" || v == "YES" || v == "ON") return true;
    if (v == "FALSE" || v == "NO" || v == "OFF") return false;
    error(path, fmt::format("expected true or false, got {}", shown(n)));
    return std::nullopt;
  }

  std::optional<std::int64_t> integer(const YAML::Node& n, const std::string& path,
                                      std::int64_t min) {
    if (n.IsScalar()) {
      const std::string& s = n.Scalar();
      std::size_t used = 0;
      try {
        const long long v = std::stoll(s, &used);
        if (used == s.size() && v >= min) return v;
      } catch (const std::exception&) {
      }
    }
    error(path, fmt::format("expected an integer >= {}, got {}", min, shown(n)));
    return std::nullopt;
  }

  // One of `names` in any case; `numbered` also accepts 1..N for the N names, in their order.
  template <typename E, std::size_t N>
  std::optional<E> choice(const YAML::Node& n, const std::string& path,
                          const std::array<std::string_view, N>& names, bool numbered = false) {
    if (n.IsScalar()) {
      const std::string v = upper(n.Scalar());
      for (std::size_t i = 0; i < N; ++i) {
        if (v == upper(names[i]) || (numbered && v == std::to_string(i + 1)))
          return static_cast<E>(i);
      }
    }
    std::string accepted = list_of(names);
    if (numbered) accepted += fmt::format(" (or 1-{} in that order)", N);
    std::string hint = n.IsScalar() ? did_you_mean(upper(n.Scalar()), names) : "";
    if (hint.empty() && n.IsScalar()) hint = did_you_mean(n.Scalar(), names);
    error(path, fmt::format("{} is not one of {}{}", shown(n), accepted, hint));
    return std::nullopt;
  }

  static std::string shown(const YAML::Node& n) {
    if (n.IsScalar()) return fmt::format("'{}'", n.Scalar());
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    return "nothing";
  }

 private:
  std::vector<ConfigError::Problem> problems_;
};

constexpr std::array<std::string_view, 16> kFsdpKeys = {"fsdp_version",
                                                        "fsdp_sharding_strategy",
                                                        "fsdp_reshard_after_forward",
                                                        "fsdp_offload_params",
                                                        "fsdp_backward_prefetch",
                                                        "fsdp_backward_prefetch_policy",
                                                        "fsdp_forward_prefetch",
                                                        "fsdp_state_dict_type",
                                                        "fsdp_cpu_ram_efficient_loading",
                                                        "fsdp_sync_module_states",
                                                        "fsdp_use_orig_params",
                                                        "fsdp_auto_wrap_policy",
                                                        "fsdp_transformer_layer_cls_to_wrap",
                                                        "fsdp_min_num_params",
                                                        "fsdp_activation_checkpointing",
                                                        "fsdp_mixed_precision_policy"};

void read_fsdp_key(Reader& r, const std::string& key, const YAML::Node& v,
                   AccelerateFsdpConfig& c) {
  const std::string path = "fsdp_config." + key;
  if (key == "fsdp_version") {
    if (const auto n = r.integer(v, path, 1)) {
      if (*n > 2)
        r.error(path, fmt::format("'{}' is not an FSDP version: 1 or 2", *n));
      else
        c.fsdp_version = static_cast<int>(*n);
    }
  } else if (key == "fsdp_sharding_strategy") {
    c.sharding_strategy = r.choice<ShardingStrategy>(v, path, kShardingNames, true);
  } else if (key == "fsdp_reshard_after_forward") {
    // Recent `accelerate config` stores an FSDP1 sharding strategy under this key as well.
    const std::string s = v.IsScalar() ? upper(v.Scalar()) : "";
    const bool strategy = std::any_of(kShardingNames.begin(), kShardingNames.end(),
                                      [&](std::string_view n) { return s == n; });
    if (strategy)
      c.sharding_strategy = r.choice<ShardingStrategy>(v, path, kShardingNames);
    else
      c.reshard_after_forward = r.boolean(v, path);
  } else if (key == "fsdp_offload_params") {
    c.offload_params = r.boolean(v, path);
  } else if (key == "fsdp_backward_prefetch" || key == "fsdp_backward_prefetch_policy") {
    c.backward_prefetch = r.choice<BackwardPrefetch>(v, path, kPrefetchNames);
  } else if (key == "fsdp_forward_prefetch") {
    c.forward_prefetch = r.boolean(v, path);
  } else if (key == "fsdp_state_dict_type") {
    c.state_dict_type = r.choice<StateDictType>(v, path, kStateDictNames);
  } else if (key == "fsdp_cpu_ram_efficient_loading") {
    c.cpu_ram_efficient_loading = r.boolean(v, path);
  } else if (key == "fsdp_sync_module_states") {
    c.sync_module_states = r.boolean(v, path);
  } else if (key == "fsdp_use_orig_params") {
    c.use_orig_params = r.boolean(v, path);
  } else if (key == "fsdp_auto_wrap_policy") {
    c.auto_wrap_policy = r.choice<AutoWrapPolicy>(v, path, kWrapNames);
  } else if (key == "fsdp_transformer_layer_cls_to_wrap") {
    if (v.IsScalar())
      c.transformer_layer_cls_to_wrap = v.Scalar();
    else
      r.error(path, fmt::format("expected class names (\"LlamaDecoderLayer,...\"), got {}",
                                Reader::shown(v)));
  } else if (key == "fsdp_min_num_params") {
    c.min_num_params = r.integer(v, path, 0);
  } else if (key == "fsdp_activation_checkpointing") {
    c.activation_checkpointing = r.boolean(v, path);
  } else {
    c.other_fsdp_keys.push_back(key);
  }
}

void read_top_level(Reader& r, const YAML::Node& root, AccelerateFsdpConfig& c) {
  const YAML::Node type = root["distributed_type"];
  if (!type) {
    r.error("distributed_type",
            "missing: an Accelerate FSDP config says distributed_type: FSDP and has an "
            "fsdp_config block (as `accelerate config` writes it)");
  } else if (!type.IsScalar() || type.Scalar() != "FSDP") {
    std::string fix = "from-fsdp converts Accelerate FSDP configs";
    if (type.IsScalar() && type.Scalar() == "DEEPSPEED")
      fix += "; this one already uses DeepSpeed (its ds_config is deepspeed_config_file)";
    r.error("distributed_type", fmt::format("{} is not FSDP: {}", Reader::shown(type), fix));
  }
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = key_of(it->first);
    const YAML::Node& v = it->second;
    if (key == "distributed_type" || key == "fsdp_config") continue;
    if (key == "mixed_precision") {
      // An unquoted `no` or `false` reaches PyYAML as False, which Accelerate takes as "no".
      if (v.IsScalar() && upper(v.Scalar()) == "FALSE")
        c.mixed_precision = MixedPrecision::No;
      else
        c.mixed_precision = r.choice<MixedPrecision>(v, key, kPrecisionNames);
    } else if (key == "num_processes") {
      c.num_processes = r.integer(v, key, 1);
    } else if (key == "num_machines") {
      c.num_machines = r.integer(v, key, 1);
    } else {
      c.other_keys.push_back(key);
    }
  }
}

}  // namespace

std::string_view name_of(ShardingStrategy v) {
  return kShardingNames[static_cast<std::size_t>(v)];
}
std::string_view name_of(BackwardPrefetch v) {
  return kPrefetchNames[static_cast<std::size_t>(v)];
}
std::string_view name_of(StateDictType v) {
  return kStateDictNames[static_cast<std::size_t>(v)];
}
std::string_view name_of(AutoWrapPolicy v) {
  return kWrapNames[static_cast<std::size_t>(v)];
}
std::string_view name_of(MixedPrecision v) {
  return kPrecisionNames[static_cast<std::size_t>(v)];
}

std::span<const std::string_view> fsdp_config_keys() {
  return kFsdpKeys;
}

AccelerateFsdpConfig parse_accelerate_config(std::string_view yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw located(e);
  }
  if (!root.IsMap()) {
    throw ConfigError(
        "", fmt::format("an Accelerate config is a YAML mapping, got {}", Reader::shown(root)));
  }
  Reader r;
  AccelerateFsdpConfig c;
  try {
    read_top_level(r, root, c);
    const YAML::Node fsdp = root["fsdp_config"];
    if (!fsdp || !fsdp.IsMap()) {
      r.error(
          "fsdp_config",
          fmt::format("{}: the FSDP settings go in an fsdp_config mapping (fsdp_sharding_strategy "
                      "or fsdp_reshard_after_forward, fsdp_offload_params, ...)",
                      fsdp ? "not a mapping" : "missing"));
    } else {
      for (auto it = fsdp.begin(); it != fsdp.end(); ++it)
        read_fsdp_key(r, key_of(it->first), it->second, c);
    }
  } catch (const YAML::Exception& e) {
    throw located(e);
  }
  r.throw_if_any();
  return c;
}

std::string write_accelerate_config(const AccelerateFsdpConfig& c) {
  // Keys sorted, as `accelerate config` (yaml.dump) writes them.
  std::map<std::string, std::string> fsdp;
  auto put_bool = [&](std::string_view key, const std::optional<bool>& v) {
    if (v) fsdp[std::string(key)] = *v ? "true" : "false";
  };
  auto put_name = [&](std::string_view key, std::optional<std::string_view> v) {
    if (v) fsdp[std::string(key)] = std::string(*v);
  };
  auto name_or_none = [](const auto& v) -> std::optional<std::string_view> {
    if (v) return name_of(*v);
    return std::nullopt;
  };
  put_bool("fsdp_activation_checkpointing", c.activation_checkpointing);
  put_name("fsdp_auto_wrap_policy", name_or_none(c.auto_wrap_policy));
  put_name("fsdp_backward_prefetch", name_or_none(c.backward_prefetch));
  put_bool("fsdp_cpu_ram_efficient_loading", c.cpu_ram_efficient_loading);
  put_bool("fsdp_forward_prefetch", c.forward_prefetch);
  if (c.min_num_params) fsdp["fsdp_min_num_params"] = std::to_string(*c.min_num_params);
  put_bool("fsdp_offload_params", c.offload_params);
  put_bool("fsdp_reshard_after_forward", c.reshard_after_forward);
  put_name("fsdp_sharding_strategy", name_or_none(c.sharding_strategy));
  put_name("fsdp_state_dict_type", name_or_none(c.state_dict_type));
  put_bool("fsdp_sync_module_states", c.sync_module_states);
  if (c.transformer_layer_cls_to_wrap)
    fsdp["fsdp_transformer_layer_cls_to_wrap"] = *c.transformer_layer_cls_to_wrap;
  put_bool("fsdp_use_orig_params", c.use_orig_params);
  fsdp["fsdp_version"] = std::to_string(c.fsdp_version);

  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "distributed_type" << YAML::Value << "FSDP";
  out << YAML::Key << "fsdp_config" << YAML::Value << YAML::BeginMap;
  for (const auto& [key, value] : fsdp) out << YAML::Key << key << YAML::Value << value;
  out << YAML::EndMap;
  if (c.mixed_precision == MixedPrecision::No) {
    // Quoted, as Accelerate writes it: a plain `no` is a boolean to YAML 1.1 readers.
    out << YAML::Key << "mixed_precision" << YAML::Value << YAML::SingleQuoted << "no";
  } else if (c.mixed_precision) {
    out << YAML::Key << "mixed_precision" << YAML::Value
        << std::string(name_of(*c.mixed_precision));
  }
  if (c.num_machines) out << YAML::Key << "num_machines" << YAML::Value << *c.num_machines;
  if (c.num_processes) out << YAML::Key << "num_processes" << YAML::Value << *c.num_processes;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace zero::config::fsdp
