// Logging to stderr, filtered by RCOLL_DEBUG=WARN|INFO|TRACE (default WARN).
// Lines look like "[rcoll 12345 rank 3] INFO: ...".
#pragma once

#include <string>

namespace rcoll {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

LogLevel logLevel();        // read from RCOLL_DEBUG once
void setLogRank(int rank);  // shown in the prefix (per process; last communicator wins)
void logMessage(LogLevel level, const std::string& message);

}  // namespace rcoll

#define RCOLL_LOG(level, ...)                                                                          \
  do {                                                                                                 \
    if (::rcoll::logLevel() >= (level)) ::rcoll::logMessage((level), ::rcoll::strFormat(__VA_ARGS__)); \
  } while (0)
#define RCOLL_WARN(...) RCOLL_LOG(::rcoll::LogLevel::kWarn, __VA_ARGS__)
#define RCOLL_INFO(...) RCOLL_LOG(::rcoll::LogLevel::kInfo, __VA_ARGS__)
#define RCOLL_TRACE(...) RCOLL_LOG(::rcoll::LogLevel::kTrace, __VA_ARGS__)
