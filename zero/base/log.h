// Minimal leveled logging to stderr. Library code reports through here rather than printing, so
// an embedding can silence or redirect it.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace zero::log {

enum class Level { Debug = 0, Info = 1, Note = 2, Warning = 3, Error = 4, Off = 5 };

// Messages below this level are dropped. Default: Info, or ZERO_LOG_LEVEL from the environment
// (debug, info, note, warning, error, off). Thread-safe.
void set_level(Level level);
Level level();

// Replaces the sink (default: one line to stderr, "zero: warning: ..."). Pass nullptr to restore
// the default. The sink may be called from any thread, one call at a time.
using Sink = std::function<void(Level, std::string_view)>;
void set_sink(Sink sink);

void write(Level level, std::string_view message);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Debug) write(Level::Debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Info) write(Level::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void note(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Note) write(Level::Note, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Warning) write(Level::Warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Error) write(Level::Error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace zero::log
