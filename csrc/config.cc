#include "config.h"

#include <cctype>
#include <cstdlib>

#include "error.h"

namespace rcoll {

const std::vector<ConfigVar>& configVars() {
  static const std::vector<ConfigVar> vars = {
      {"RCOLL_DEBUG", "WARN", "log level: WARN, INFO or TRACE (NONE silences warnings)"},
      {"RCOLL_TRANSPORT", "auto", "data transport: auto or tcp"},
      {"RCOLL_SOCKET_IFNAME", "", "network interface whose IPv4 address data sockets bind to "
                                  "(default: the address that reaches the rendezvous store)"},
      {"RCOLL_SOCKET_BUFFER_BYTES", "0", "SO_SNDBUF/SO_RCVBUF for data sockets; 0 keeps the "
                                         "kernel's autotuning, which usually grows larger"},
      {"RCOLL_CHUNK_BYTES", "1M", "largest pipeline segment of the ring algorithms"},
      {"RCOLL_MIN_CHUNK_BYTES", "64K", "smallest segment the ring cuts a block into for overlap"},
      {"RCOLL_PIPELINE_SLOTS", "8", "staging segments that may be in flight per operation"},
      {"RCOLL_CONNECT_TIMEOUT", "300", "seconds to wait for peers during rendezvous"},
      {"RCOLL_TIMEOUT", "1800", "default per-operation timeout in seconds (numpy API)"},
      {"RCOLL_SHUTDOWN_TIMEOUT", "10", "seconds shutdown() lets pending operations finish before aborting them"},
  };
  return vars;
}

size_t parseByteSize(const std::string& name, const std::string& value) {
  size_t pos = 0;
  unsigned long long number = 0;
  bool ok = !value.empty() && std::isdigit(static_cast<unsigned char>(value[0]));
  if (ok) {
    try {
      number = std::stoull(value, &pos);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  unsigned long long scale = 1;
  if (ok && pos < value.size()) {
    char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(value[pos])));
    scale = suffix == 'K' ? 1ull << 10 : suffix == 'M' ? 1ull << 20 : suffix == 'G' ? 1ull << 30 : 0;
    pos++;
    if (pos < value.size() && (value[pos] == 'B' || value[pos] == 'b')) pos++;
    ok = scale != 0 && pos == value.size();
  }
  if (!ok) {
    throwError(ErrorKind::kConfig,
               strFormat("%s=%s is not a byte size (examples: 65536, 64K, 4M)", name.c_str(), value.c_str()));
  }
  return static_cast<size_t>(number * scale);
}

static const char* envOrNull(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

static long parseInt(const char* name, const char* value, long lo, long hi) {
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || parsed < lo || parsed > hi) {
    throwError(ErrorKind::kConfig,
               strFormat("%s=%s must be an integer in [%ld, %ld]", name, value, lo, hi));
  }
  return parsed;
}

Config Config::fromEnvironment() {
  Config config;
  if (const char* v = envOrNull("RCOLL_CHUNK_BYTES")) config.chunk_bytes = parseByteSize("RCOLL_CHUNK_BYTES", v);
  if (const char* v = envOrNull("RCOLL_MIN_CHUNK_BYTES")) {
    config.min_chunk_bytes = parseByteSize("RCOLL_MIN_CHUNK_BYTES", v);
  }
  if (config.chunk_bytes < 64 || config.chunk_bytes > (1ull << 30)) {
    throwError(ErrorKind::kConfig, "RCOLL_CHUNK_BYTES must be between 64 bytes and 1G");
  }
  if (config.min_chunk_bytes < 64 || config.min_chunk_bytes > config.chunk_bytes) {
    throwError(ErrorKind::kConfig, "RCOLL_MIN_CHUNK_BYTES must be between 64 bytes and RCOLL_CHUNK_BYTES");
  }
  if (const char* v = envOrNull("RCOLL_PIPELINE_SLOTS")) {
    config.pipeline_slots = static_cast<int>(parseInt("RCOLL_PIPELINE_SLOTS", v, 1, 256));
  }
  if (const char* v = envOrNull("RCOLL_SOCKET_BUFFER_BYTES")) {
    config.socket_buffer_bytes = parseByteSize("RCOLL_SOCKET_BUFFER_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_SOCKET_IFNAME")) config.socket_ifname = v;
  if (const char* v = envOrNull("RCOLL_TRANSPORT")) {
    config.transport = v;
    if (config.transport != "auto" && config.transport != "tcp") {
      throwError(ErrorKind::kConfig,
                 strFormat("RCOLL_TRANSPORT=%s is not supported by this build (use auto or tcp)", v));
    }
  }
  if (const char* v = envOrNull("RCOLL_CONNECT_TIMEOUT")) {
    config.connect_timeout = std::chrono::seconds(parseInt("RCOLL_CONNECT_TIMEOUT", v, 1, 86400));
  }
  return config;
}

std::string Config::describe() const {
  return strFormat("transport=%s chunk_bytes=%zu min_chunk_bytes=%zu pipeline_slots=%d "
                   "socket_buffer_bytes=%zu socket_ifname=%s",
                   transport.c_str(), chunk_bytes, min_chunk_bytes, pipeline_slots,
                   socket_buffer_bytes, socket_ifname.empty() ? "(auto)" : socket_ifname.c_str());
}

}  // namespace rcoll
