#include "zero/base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace zero::log {

namespace {

Level level_from_env() {
  const char* env = std::getenv("ZERO_LOG_LEVEL");
  if (env == nullptr) return Level::Info;
  const std::string v(env);
  if (v == "debug") return Level::Debug;
  if (v == "info") return Level::Info;
  if (v == "note") return Level::Note;
  if (v == "warning") return Level::Warning;
  if (v == "error") return Level::Error;
  if (v == "off") return Level::Off;
  return Level::Info;
}

std::atomic<Level>& current_level() {
  static std::atomic<Level> lvl{level_from_env()};
  return lvl;
}

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

Sink& sink() {
  static Sink s;
  return s;
}

std::string_view level_word(Level l) {
  switch (l) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Note: return "note";
    case Level::Warning: return "warning";
    case Level::Error: return "error";
    case Level::Off: return "";
  }
  return "";
}

}  // namespace

void set_level(Level l) {
  current_level().store(l);
}
Level level() {
  return current_level().load();
}

void set_sink(Sink s) {
  std::lock_guard lock(sink_mutex());
  sink() = std::move(s);
}

void write(Level l, std::string_view message) {
  if (l < level()) return;
  std::lock_guard lock(sink_mutex());
  if (sink()) {
    sink()(l, message);
    return;
  }
  std::fprintf(stderr, "zero: %.*s: %.*s\n", static_cast<int>(level_word(l).size()),
               level_word(l).data(), static_cast<int>(message.size()), message.data());
}

}  // namespace zero::log
