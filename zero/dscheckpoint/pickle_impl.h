// Internal to zero/dscheckpoint: the parser behind Pickle::parse, shared by pickle.cpp (the
// value types and dict key codes), pickle_vm.cpp (the opcode loop: input, stack, memo, plain
// values) and pickle_globals.cpp (the allow-list and what calling an allowed global builds).
// Nothing outside those files includes it.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zero/dscheckpoint/pickle.h"

namespace zero::dscheckpoint {

namespace detail {

// Owns every value of one parsed pickle; views share it.
struct PickleArena {
  std::string file;
  std::vector<std::unique_ptr<PickleValue>> values;
};

// The numel and the reached span of a strided view, or nothing when a size is negative or the
// arithmetic overflows.
struct ViewExtent {
  std::int64_t numel;
  std::int64_t span;
};
std::optional<ViewExtent> view_extent(std::int64_t offset, const std::vector<std::int64_t>& shape,
                                      const std::vector<std::int64_t>& stride);

// A code equal for keys Python's dict treats as equal (1 == 1.0 == True), for the kinds a
// checkpoint uses as keys; appended to `out`. Unhashable kinds give false. Dict::index is keyed
// by these codes, so the parser (inserting) and the views (looking up) must agree on them.
bool key_code(const PickleValue* v, std::string& out, int depth);
std::string string_key_code(std::string_view key);
std::string int_key_code(std::int64_t key);

// An entry of the allow-list (pickle_globals.cpp).
struct AllowedGlobal;

}  // namespace detail

// Runs a pickle's opcodes once over `bytes`, building values into a fresh arena. Any error
// throws IoError naming the file, the byte offset and the opcode being run.
class PickleParser {
 public:
  PickleParser(std::span<const std::byte> bytes, std::string file)
      : in_(bytes), arena_(std::make_shared<detail::PickleArena>()) {
    arena_->file = std::move(file);
  }

  std::pair<std::shared_ptr<detail::PickleArena>, const PickleValue*> run();

 private:
  using K = PickleValue::Kind;
  using Items = PickleValue::Items;
  using AllowedGlobal = detail::AllowedGlobal;

  [[noreturn]] void fail(const std::string& message) const;

  PickleValue* make(K kind, PickleValue::Data data = {}) {
    count_value();
    auto v = std::make_unique<PickleValue>();
    v->kind_ = kind;
    v->data_ = std::move(data);
    arena_->values.push_back(std::move(v));
    return arena_->values.back().get();
  }

  void count_value() {
    if (++values_ > Pickle::kMaxValues) {
      fail(
          fmt::format("more than {} values and marks; refusing to build more", Pickle::kMaxValues));
    }
  }

  // Input.
  std::size_t left() const { return in_.size() - pos_; }
  std::span<const std::byte> take(std::uint64_t n) {
    if (n > left()) fail(fmt::format("needs {} bytes, the input has {} left", n, left()));
    auto s = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::uint64_t take_le(int bytes) {
    auto s = take(static_cast<std::uint64_t>(bytes));
    std::uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(s[i]);
    return v;
  }
  std::string_view take_line() {
    const auto* begin = reinterpret_cast<const char*>(in_.data()) + pos_;
    const void* nl = std::memchr(begin, '\n', left());
    if (nl == nullptr) fail("the line has no end");
    const auto n = static_cast<std::size_t>(static_cast<const char*>(nl) - begin);
    pos_ += n + 1;
    return {begin, n};
  }
  std::string take_string(std::uint64_t n) {
    auto s = take(n);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

  // Stack (Python's pickle: MARK moves the stack aside, so no opcode pops below a mark).
  void push(PickleValue* v) { stack_.push_back(v); }
  PickleValue* pop() {
    if (stack_.empty()) fail("the stack is empty");
    PickleValue* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  PickleValue* top() {
    if (stack_.empty()) fail("the stack is empty");
    return stack_.back();
  }
  std::vector<PickleValue*> pop_mark() {
    if (metastack_.empty()) fail("no MARK to pop to");
    std::vector<PickleValue*> items = std::move(stack_);
    stack_ = std::move(metastack_.back());
    metastack_.pop_back();
    return items;
  }
  Items as_items(const std::vector<PickleValue*>& v) { return Items(v.begin(), v.end()); }

  PickleValue* memo_get(std::uint64_t i) {
    auto it = memo_.find(i);
    if (it == memo_.end()) fail(fmt::format("memo entry {} was never stored", i));
    return it->second;
  }

  // Dicts (pickle_vm.cpp).
  void set_item(PickleValue* dict, const PickleValue* key, const PickleValue* value);
  void set_entry(PickleValue::Dict& d, const PickleValue* key, const PickleValue* value);

  // Plain values (pickle_vm.cpp).
  void load_int_text(std::string_view line);
  // Two's complement little-endian of any length that fits 64 bits.
  void load_long(std::uint64_t n);

  static std::int64_t int_of(const PickleValue* v, bool* ok) {
    if (v->kind() == K::Int) return std::get<std::int64_t>(v->data());
    if (v->kind() == K::Bool) return std::get<bool>(v->data()) ? 1 : 0;
    *ok = false;
    return 0;
  }

  // Globals, persistent ids, REDUCE, NEWOBJ and BUILD (pickle_globals.cpp).
  std::vector<std::int64_t> int_tuple(const PickleValue* v, const char* what);
  void load_global(std::string module, std::string name);
  const AllowedGlobal& allowed_of(const PickleValue* v);
  PickleValue* make_storage(const PickleValue* pid);
  PickleValue* make_tensor(const Items& a, bool v2);
  PickleValue* call(const PickleValue* callable, const PickleValue* args_value,
                    bool nested = false);
  PickleValue* instantiate(const PickleValue* cls, const PickleValue* args);
  void build(PickleValue* inst, const PickleValue* state);

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  unsigned char op_ = 0;
  std::shared_ptr<detail::PickleArena> arena_;
  std::vector<PickleValue*> stack_;
  std::vector<std::vector<PickleValue*>> metastack_;
  std::unordered_map<std::uint64_t, PickleValue*> memo_;
  std::size_t values_ = 0;
};

}  // namespace zero::dscheckpoint
