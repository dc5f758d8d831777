// Human-readable byte counts for messages, logs and reports.
#pragma once

#include <cstdint>
#include <string>

namespace zero {

// Binary units with one decimal: "812 B", "1.5 KiB", "12.0 MiB", "3.2 GiB", "1.1 TiB".
std::string format_bytes(std::uint64_t bytes);

// Decimal units with two decimals, as DeepSpeed's memory estimators print them: "0", "512 B",
// "1.50 kB", "31.40 GB", "1.20 TB".
std::string format_bytes_decimal(double bytes);

}  // namespace zero
