// Who is calling an attention node, and on whose behalf: the owner of the sequences a call may
// see, and the compute-node process that made them (docs/deploy.md, "Security model").
//
// Server side (CallerOf): with mTLS the owner is the verified client certificate's subject
// ("x509:<subject>"); on a plaintext node (--insecure) it is the bearer token the caller sends in
// the `magicpig-owner-token` metadata ("token:<token>"), or "" when it sends none. The process
// names itself in `magicpig-instance` (stable across its restarts: by default its host name) and
// `magicpig-incarnation` (fresh at each start), so that a restarted compute node can drop what its
// previous run left on a node.
//
// Client side (CallIdentity): what the compute node puts on every call (Apply).
//
// Thread-safety: CallIdentity is immutable after construction; CallerOf is a pure function.
#ifndef MAGICPIG_COMMON_FABRIC_CALL_IDENTITY_H_
#define MAGICPIG_COMMON_FABRIC_CALL_IDENTITY_H_

#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace magicpig::fabric {

inline constexpr char kOwnerTokenKey[] = "magicpig-owner-token";
inline constexpr char kInstanceKey[] = "magicpig-instance";
inline constexpr char kIncarnationKey[] = "magicpig-incarnation";

// A caller as an attention node sees it.
struct Caller {
  std::string owner;        // "x509:<subject>", "token:<token>" or ""
  std::string instance;     // "" when not sent
  std::string incarnation;  // "" when not sent

  // The owner for a log line: the certificate subject, or "token"/"-" (never the token itself).
  std::string LogName() const;
};

// The caller of a server call: owner from the peer certificate when the connection is TLS (tls =
// true: the server only accepts verified client certificates), else from the token metadata.
Caller CallerOf(const grpc::ServerContextBase& context, bool tls);

// What a compute node sends on each call.
class CallIdentity {
 public:
  // owner_token: empty sends none (a TLS node ignores it anyway); instance: empty picks the host
  // name; the incarnation is 128 random bits, fresh per object.
  CallIdentity(std::string owner_token, std::string instance);

  void Apply(grpc::ClientContext* context) const;

  const std::string& instance() const { return instance_; }
  const std::string& incarnation() const { return incarnation_; }

  // 128 bits from the kernel's CSPRNG (getrandom), as 32 hex digits.
  static std::string RandomHex128();

 private:
  std::string owner_token_;
  std::string instance_;
  std::string incarnation_;
};

}  // namespace magicpig::fabric

#endif  // MAGICPIG_COMMON_FABRIC_CALL_IDENTITY_H_
