#include "name_filter.h"

#include <cstdlib>
#include <sstream>

namespace rcoll {

NameFilter::NameFilter(const std::string& spec_in) : empty_(spec_in.empty()) {
  std::string spec = spec_in;
  if (!spec.empty() && spec[0] == '^') {
    exclude_ = true;
    spec.erase(0, 1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact_ = true;
    spec.erase(0, 1);
  }
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      items_.emplace_back(item, -1);
    } else {
      items_.emplace_back(item.substr(0, colon), std::atoi(item.c_str() + colon + 1));
    }
  }
}

bool NameFilter::accepts(const std::string& name, int port) const {
  if (empty_) return true;
  bool listed = false;
  for (const auto& [want, want_port] : items_) {
    const bool name_ok = exact_ ? name == want : name.compare(0, want.size(), want) == 0;
    if (name_ok && (want_port < 0 || want_port == port)) listed = true;
  }
  return exclude_ ? !listed : listed;
}

std::vector<std::string> NameFilter::names() const {
  std::vector<std::string> out;
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

}  // namespace rcoll
