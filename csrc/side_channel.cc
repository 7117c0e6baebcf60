#include "side_channel.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "peer_listener.h"

namespace rcoll {

namespace {

constexpr auto kAbortLinger = std::chrono::seconds(2);

}  // namespace

SideChannelNews SideChannelReader::read(int fd) {
  SideChannelNews news;
  auto* header = reinterpret_cast<char*>(&header_);
  for (;;) {
    const bool have_header = got_ == sizeof(WireHeader);
    if (have_header && (header_.magic != kWireMagic || header_.kind != static_cast<uint8_t>(OpKind::kAbort))) {
      news.kind = SideChannelNews::Kind::kGarbage;
      return news;
    }
    const uint64_t announced = header_.bytes;  // a copy: the packed field may be misaligned
    const size_t want = static_cast<size_t>(std::min<uint64_t>(announced, kMaxAbortText));
    if (have_header && text_.size() >= want) break;
    char text[kMaxAbortText];
    ssize_t n = have_header ? ::recv(fd, text, want - text_.size(), MSG_DONTWAIT)
                            : ::recv(fd, header + got_, sizeof(WireHeader) - got_, MSG_DONTWAIT);
    if (n > 0) {
      if (have_header) {
        text_.append(text, static_cast<size_t>(n));
      } else {
        got_ += static_cast<size_t>(n);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return news;
    if (have_header) break;  // closed mid-text: report what we have
    news.kind = SideChannelNews::Kind::kClosed;
    news.error = n < 0 ? errno : 0;
    return news;
  }
  news.kind = SideChannelNews::Kind::kAbort;
  news.abort_kind = errorKindFromWire(header_.error_kind);
  news.text = validUtf8(text_);
  return news;
}

AbortMessage::AbortMessage(const ConnectInfo& info, ErrorKind kind, const std::string& message)
    : text_(truncateUtf8(message, kMaxAbortText)),
      header_(makeAbortHeader(info, kind, text_.size())),
      deadline_(std::chrono::steady_clock::now() + kAbortLinger) {}

void AbortMessage::sendTo(int fd) const {
  std::string why;
  if (sendAll(fd, &header_, sizeof(header_), deadline_, &why)) sendAll(fd, text_.data(), text_.size(), deadline_, &why);
  ::shutdown(fd, SHUT_WR);
}

}  // namespace rcoll
