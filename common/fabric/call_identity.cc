#include "common/fabric/call_identity.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace magicpig::fabric {
namespace {

// The first value of metadata `key` sent by the client, or "".
std::string Metadata(const grpc::ServerContextBase& context, std::string_view key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

std::string Caller::LogName() const {
  if (owner.rfind("x509:", 0) == 0) return owner;
  return owner.empty() ? "-" : "token";
}

Caller CallerOf(const grpc::ServerContextBase& context, bool tls) {
  Caller caller;
  caller.instance = Metadata(context, kInstanceKey);
  caller.incarnation = Metadata(context, kIncarnationKey);
  if (tls) {
    // The server only completes handshakes with verified client certificates, so the subject is
    // the CA's word for who this is.
    std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
    if (auth != nullptr) {
      for (const char* property : {"x509_subject", "x509_common_name"}) {
        std::vector<grpc::string_ref> values = auth->FindPropertyValues(property);
        if (!values.empty()) {
          caller.owner = absl::StrCat("x509:", std::string(values[0].data(), values[0].size()));
          return caller;
        }
      }
    }
    // A TLS connection without a subject cannot happen with a required client certificate; own
    // nothing rather than share "".
    caller.owner = "x509:?";
    return caller;
  }
  const std::string token = Metadata(context, kOwnerTokenKey);
  if (!token.empty()) caller.owner = absl::StrCat("token:", token);
  return caller;
}

CallIdentity::CallIdentity(std::string owner_token, std::string instance)
    : owner_token_(std::move(owner_token)),
      instance_(instance.empty() ? HostName() : std::move(instance)),
      incarnation_(RandomHex128()) {}

void CallIdentity::Apply(grpc::ClientContext* context) const {
  if (!owner_token_.empty()) context->AddMetadata(kOwnerTokenKey, owner_token_);
  context->AddMetadata(kInstanceKey, instance_);
  context->AddMetadata(kIncarnationKey, incarnation_);
}

std::string CallIdentity::RandomHex128() {
  uint8_t bytes[16];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n <= 0) break;  // EINTR or no getrandom: fall back below
    filled += static_cast<size_t>(n);
  }
  if (filled < sizeof(bytes)) {
    std::random_device device;  // /dev/urandom on Linux
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(device());
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace magicpig::fabric
