// The pickle virtual machine: Pickle::parse runs the opcodes once, reading the input, keeping
// the stack, the marks and the memo, and building the plain values (None, bools, ints, floats,
// strings, bytes, lists, tuples, sets, dicts) itself. Globals and what calling them builds are
// pickle_globals.cpp's.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>

#include "zero/base/error.h"
#include "zero/dscheckpoint/pickle.h"
#include "zero/dscheckpoint/pickle_impl.h"

namespace zero::dscheckpoint {

namespace {

const char* opcode_name(unsigned char op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
  }
  return nullptr;
}

}  // namespace

void PickleParser::fail(const std::string& message) const {
  const char* name = opcode_name(op_);
  throw IoError(fmt::format("{}: pickle byte {} (opcode {}): {}", arena_->file, op_pos_,
                            name != nullptr ? name : fmt::format("0x{:02x}", op_), message));
}

void PickleParser::set_item(PickleValue* dict, const PickleValue* key, const PickleValue* value) {
  if (dict->kind() != K::Dict) fail(fmt::format("sets an item on a {}", kind_name(dict->kind())));
  set_entry(std::get<PickleValue::Dict>(dict->data_), key, value);
}

void PickleParser::set_entry(PickleValue::Dict& d, const PickleValue* key,
                             const PickleValue* value) {
  std::string code;
  if (!detail::key_code(key, code, 0))
    fail(fmt::format("unhashable dict key of type {}", kind_name(key->kind())));
  auto [it, inserted] = d.index.emplace(std::move(code), d.entries.size());
  if (inserted) {
    d.entries.emplace_back(key, value);
  } else {
    d.entries[it->second].second = value;
  }
}

void PickleParser::load_int_text(std::string_view line) {
  if (line == "01") return push(make(K::Bool, true));
  if (line == "00") return push(make(K::Bool, false));
  if (!line.empty() && line.back() == 'L') line.remove_suffix(1);
  std::int64_t v = 0;
  const auto r = std::from_chars(line.data(), line.data() + line.size(), v);
  if (r.ec != std::errc() || r.ptr != line.data() + line.size()) {
    fail(fmt::format("'{}' is not a 64-bit integer", line.substr(0, 40)));
  }
  push(make(K::Int, v));
}

void PickleParser::load_long(std::uint64_t n) {
  auto s = take(n);
  if (n == 0) return push(make(K::Int, std::int64_t{0}));
  const bool negative = (static_cast<std::uint8_t>(s[n - 1]) & 0x80) != 0;
  const std::uint8_t fill = negative ? 0xff : 0x00;
  for (std::uint64_t i = 8; i < n; ++i) {
    if (static_cast<std::uint8_t>(s[i]) != fill)
      fail(fmt::format("a {}-byte integer does not fit 64 bits", n));
  }
  std::uint64_t u = negative ? ~std::uint64_t{0} : 0;
  for (std::uint64_t i = std::min<std::uint64_t>(n, 8); i-- > 0;) {
    u = (u << 8) | static_cast<std::uint8_t>(s[i]);
  }
  if (n < 8) {
    // Sign-extend from n bytes.
    const unsigned bits = static_cast<unsigned>(n) * 8;
    u &= (std::uint64_t{1} << bits) - 1;
    if (negative) u |= ~((std::uint64_t{1} << bits) - 1);
  } else if (n > 8 && ((u >> 63) != 0) != negative) {
    fail(fmt::format("a {}-byte integer does not fit 64 bits", n));
  }
  push(make(K::Int, static_cast<std::int64_t>(u)));
}

std::pair<std::shared_ptr<detail::PickleArena>, const PickleValue*> PickleParser::run() {
  while (true) {
    op_pos_ = pos_;
    if (left() == 0) {
      op_ = 0;
      throw IoError(
          fmt::format("{}: pickle ends at byte {} without a STOP opcode", arena_->file, pos_));
    }
    op_ = static_cast<unsigned char>(in_[pos_++]);
    switch (op_) {
      case 0x80: {  // PROTO
        const auto v = take_le(1);
        if (v > 5) fail(fmt::format("protocol {} is newer than 5", v));
        break;
      }
      case 0x95: (void)take_le(8); break;  // FRAME: framing only
      case '.': {
        PickleValue* result = pop();
        return {std::move(arena_), result};
      }
      case '(':
        count_value();
        metastack_.push_back(std::move(stack_));
        stack_.clear();
        break;
      case '0':
        if (!stack_.empty()) {
          stack_.pop_back();
        } else {
          (void)pop_mark();
        }
        break;
      case '1': (void)pop_mark(); break;
      case '2': push(top()); break;

      case 'N': push(make(K::None)); break;
      case 0x88: push(make(K::Bool, true)); break;
      case 0x89: push(make(K::Bool, false)); break;
      case 'I': load_int_text(take_line()); break;
      case 'L': load_int_text(take_line()); break;
      case 'J':
        push(make(K::Int, static_cast<std::int64_t>(static_cast<std::int32_t>(take_le(4)))));
        break;
      case 'K': push(make(K::Int, static_cast<std::int64_t>(take_le(1)))); break;
      case 'M': push(make(K::Int, static_cast<std::int64_t>(take_le(2)))); break;
      case 0x8a: load_long(take_le(1)); break;
      case 0x8b: {
        const auto n = static_cast<std::int32_t>(take_le(4));
        if (n < 0) fail("negative length");
        load_long(static_cast<std::uint64_t>(n));
        break;
      }
      case 'G': {
        auto s = take(8);
        std::uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | static_cast<std::uint8_t>(s[i]);
        push(make(K::Float, std::bit_cast<double>(bits)));
        break;
      }
      case 'F': {
        const std::string_view line = take_line();
        double v = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), v);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) {
          fail(fmt::format("'{}' is not a float", line.substr(0, 40)));
        }
        push(make(K::Float, v));
        break;
      }

      case 'X': push(make(K::String, take_string(take_le(4)))); break;
      case 0x8c: push(make(K::String, take_string(take_le(1)))); break;
      case 0x8d: push(make(K::String, take_string(take_le(8)))); break;
      case 'T': {
        const auto n = static_cast<std::int32_t>(take_le(4));
        if (n < 0) fail("negative length");
        push(make(K::String, take_string(static_cast<std::uint64_t>(n))));
        break;
      }
      case 'U': push(make(K::String, take_string(take_le(1)))); break;
      case 'V': {
        const std::string_view line = take_line();
        if (line.find('\\') != std::string_view::npos)
          fail("escaped UNICODE text is not supported");
        push(make(K::String, std::string(line)));
        break;
      }
      case 'B': push(make(K::Bytes, take_string(take_le(4)))); break;
      case 'C': push(make(K::Bytes, take_string(take_le(1)))); break;
      case 0x8e: push(make(K::Bytes, take_string(take_le(8)))); break;

      case ']': push(make(K::List, Items{})); break;
      case 'l': push(make(K::List, as_items(pop_mark()))); break;
      case 'a': {
        PickleValue* v = pop();
        PickleValue* list = top();
        if (list->kind() != K::List) fail(fmt::format("appends to a {}", kind_name(list->kind())));
        std::get<Items>(list->data_).push_back(v);
        break;
      }
      case 'e': {
        auto items = pop_mark();
        PickleValue* list = top();
        if (list->kind() != K::List) fail(fmt::format("appends to a {}", kind_name(list->kind())));
        auto& dst = std::get<Items>(list->data_);
        dst.insert(dst.end(), items.begin(), items.end());
        break;
      }
      case ')': push(make(K::Tuple, Items{})); break;
      case 't': push(make(K::Tuple, as_items(pop_mark()))); break;
      case 0x85:
      case 0x86:
      case 0x87: {
        const std::size_t n = op_ - 0x84u;
        if (stack_.size() < n)
          fail(fmt::format("needs {} values, the stack holds {}", n, stack_.size()));
        Items items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
        stack_.resize(stack_.size() - n);
        push(make(K::Tuple, std::move(items)));
        break;
      }
      case '}': push(make(K::Dict, PickleValue::Dict{})); break;
      case 'd': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) fail("DICT with an odd number of values");
        PickleValue* d = make(K::Dict, PickleValue::Dict{});
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        push(d);
        break;
      }
      case 's': {
        PickleValue* v = pop();
        PickleValue* k = pop();
        set_item(top(), k, v);
        break;
      }
      case 'u': {
        auto items = pop_mark();
        if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
        PickleValue* d = top();
        for (std::size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
        break;
      }
      case 0x8f: push(make(K::Set, Items{})); break;
      case 0x90: {
        auto items = pop_mark();
        PickleValue* set = top();
        if (set->kind() != K::Set) fail(fmt::format("adds items to a {}", kind_name(set->kind())));
        auto& dst = std::get<Items>(set->data_);
        dst.insert(dst.end(), items.begin(), items.end());
        break;
      }
      case 0x91: push(make(K::Set, as_items(pop_mark()))); break;

      case 'c': {
        std::string module(take_line());
        std::string name(take_line());
        load_global(std::move(module), std::move(name));
        break;
      }
      case 0x93: {
        PickleValue* name = pop();
        PickleValue* module = pop();
        if (module->kind() != K::String || name->kind() != K::String)
          fail("STACK_GLOBAL needs two strings");
        load_global(std::get<std::string>(module->data()), std::get<std::string>(name->data()));
        break;
      }
      case 'R': {
        PickleValue* args = pop();
        PickleValue* callable = pop();
        push(call(callable, args));
        break;
      }
      case 0x81: {
        PickleValue* args = pop();
        PickleValue* cls = pop();
        push(instantiate(cls, args));
        break;
      }
      case 0x92: {
        PickleValue* kwargs = pop();
        PickleValue* args = pop();
        PickleValue* cls = pop();
        if (kwargs->kind() != K::Dict ||
            !std::get<PickleValue::Dict>(kwargs->data()).entries.empty()) {
          fail("NEWOBJ_EX with keyword arguments");
        }
        push(instantiate(cls, args));
        break;
      }
      case 'b': {
        PickleValue* state = pop();
        build(top(), state);
        break;
      }
      case 'Q': push(make_storage(pop())); break;

      case 'p': {
        const std::string_view line = take_line();
        std::uint64_t i = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), i);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) fail("bad memo index");
        memo_[i] = top();
        break;
      }
      case 'q': memo_[take_le(1)] = top(); break;
      case 'r': memo_[take_le(4)] = top(); break;
      case 0x94: memo_[memo_.size()] = top(); break;
      case 'g': {
        const std::string_view line = take_line();
        std::uint64_t i = 0;
        const auto r = std::from_chars(line.data(), line.data() + line.size(), i);
        if (r.ec != std::errc() || r.ptr != line.data() + line.size()) fail("bad memo index");
        push(memo_get(i));
        break;
      }
      case 'h': push(memo_get(take_le(1))); break;
      case 'j': push(memo_get(take_le(4))); break;

      default: {
        const char* name = opcode_name(op_);
        fail(name != nullptr ? "this opcode is not supported by the restricted reader (it "
                               "instantiates arbitrary classes, or torch.save never writes it)"
                             : "not a pickle opcode");
      }
    }
  }
}

Pickle Pickle::parse(std::span<const std::byte> bytes, std::string file) {
  PickleParser parser(bytes, std::move(file));
  auto [arena, root] = parser.run();
  Pickle p;
  p.arena_ = std::move(arena);
  p.root_ = root;
  return p;
}

PickleView Pickle::root() const {
  return PickleView(arena_, root_, "");
}

std::size_t Pickle::value_count() const {
  return arena_->values.size();
}

}  // namespace zero::dscheckpoint
