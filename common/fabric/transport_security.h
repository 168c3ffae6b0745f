// Transport security of the node fabric (compute node <-> attention nodes): mutual TLS from three
// PEM files, or plaintext only when asked for by name. docs/deploy.md ("Security model").
//
//   mTLS: both sides present a certificate signed by the CA in --tls-ca and verify the other's;
//         the attention node requires a client certificate, and the compute node checks the
//         attention node's name against its certificate. The files are watched and reloaded every
//         --tls-reload-seconds, so a rotated Kubernetes Secret takes effect without a restart
//         (new handshakes use the new files; open connections keep theirs).
//   --insecure: plaintext, with a warning; for a laptop or a network you trust otherwise.
//   neither: a start-up error naming the flags. There is no silent plaintext default.
//
// The files are read and checked at start-up (PEM, key matches certificate, certificate signed by
// the CA, not expired) so that a wrong file is a clear error, not a failed handshake later.
//
// Thread-safety: the functions are thread-safe; the credentials they return are gRPC's.
#ifndef MAGICPIG_COMMON_FABRIC_TRANSPORT_SECURITY_H_
#define MAGICPIG_COMMON_FABRIC_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/flags/flag_table.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace magicpig::fabric {

struct TransportSecurity {
  std::string cert_file;  // PEM certificate chain of this process
  std::string key_file;   // PEM private key of cert_file
  std::string ca_file;    // PEM CA bundle the peer's certificate must chain to
  int reload_seconds = 60;
  // On the compute node: the name checked against the attention nodes' certificates instead of
  // the host of their address (e.g. one DNS name in a certificate shared by every node). Empty:
  // the address's host.
  std::string server_name;
  bool insecure = false;

  bool tls() const { return !cert_file.empty(); }
  // --insecure: for in-process tests and the library defaults.
  static TransportSecurity Plaintext() {
    TransportSecurity s;
    s.insecure = true;
    return s;
  }
};

// Declares --tls-cert, --tls-key, --tls-ca, --tls-reload-seconds and --insecure (and, with
// client = true, --tls-server-name) in a section of their own.
void DeclareTransportSecurityFlags(flags::FlagTable& table, TransportSecurity* security,
                                   bool client);

// OK when exactly one mode is chosen: all three files (each readable PEM, the key matching the
// certificate, the certificate chaining to the CA, not expired), or --insecure with none of them.
// INVALID_ARGUMENT naming the flag otherwise; `what` says who needs it ("the attention node",
// "--attention-nodes").
absl::Status ValidateTransportSecurity(const TransportSecurity& security, std::string_view what);

// Server credentials: mTLS requiring and verifying a client certificate, or plaintext for
// --insecure. Validates first (ValidateTransportSecurity).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TransportSecurity& security);

// Channel credentials for connecting to attention nodes: mTLS presenting this process's
// certificate and verifying the node's against the CA and its name, or plaintext for --insecure.
// Validates first.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TransportSecurity& security);

// The channel arguments that go with ChannelCredentials (the server-name override, if any).
grpc::ChannelArguments ChannelArgumentsFor(const TransportSecurity& security);

}  // namespace magicpig::fabric

#endif  // MAGICPIG_COMMON_FABRIC_TRANSPORT_SECURITY_H_
