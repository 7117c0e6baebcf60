// NCCL's list syntax for choosing devices by name (NCCL_SOCKET_IFNAME,
// NCCL_IB_HCA), which users already know: a comma-separated list of names,
// each matched as a prefix; `=` before the list: exact names; `^` before it:
// every name but those (`^=`: but exactly those). An entry may carry
// `:port` where ports mean something (RCOLL_IB_HCA).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rcoll {

class NameFilter {
 public:
  explicit NameFilter(const std::string& spec);  // "" accepts every name

  bool accepts(const std::string& name, int port = -1) const;
  bool excludes() const { return exclude_; }
  bool exact() const { return exact_; }
  // The names listed, without modifiers or ports.
  std::vector<std::string> names() const;

 private:
  bool empty_ = true;
  bool exclude_ = false;
  bool exact_ = false;
  std::vector<std::pair<std::string, int>> items_;  // name, port (-1: any)
};

}  // namespace rcoll
