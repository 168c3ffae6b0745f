#include "common/fabric/transport_security.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"

namespace magicpig::fabric {
namespace {

using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;
using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using BioPtr = std::unique_ptr<BIO, decltype(&BIO_free)>;

absl::Status Invalid(std::string_view flag, std::string_view file, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", std::string(flag), " '", std::string(file), "': ", std::string(problem)));
}

absl::StatusOr<std::string> ReadFile(std::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Invalid(flag, path, "cannot be read");
  std::ostringstream out;
  out << in.rdbuf();
  if (out.str().empty()) return Invalid(flag, path, "is empty");
  return out.str();
}

BioPtr Bio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

// Every certificate in a PEM text (none: INVALID_ARGUMENT).
absl::StatusOr<std::vector<CertPtr>> Certificates(std::string_view flag, const std::string& path,
                                                  const std::string& pem) {
  std::vector<CertPtr> certs;
  BioPtr bio = Bio(pem);
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(cert, &X509_free);
  }
  ERR_clear_error();  // the loop ends on "no start line"
  if (certs.empty()) return Invalid(flag, path, "holds no PEM certificate");
  return certs;
}

absl::Status Validate(const TransportSecurity& s) {
  absl::StatusOr<std::string> cert_pem = ReadFile("tls-cert", s.cert_file);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadFile("tls-key", s.key_file);
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> ca_pem = ReadFile("tls-ca", s.ca_file);
  if (!ca_pem.ok()) return ca_pem.status();
  absl::StatusOr<std::vector<CertPtr>> chain = Certificates("tls-cert", s.cert_file, *cert_pem);
  if (!chain.ok()) return chain.status();
  absl::StatusOr<std::vector<CertPtr>> cas = Certificates("tls-ca", s.ca_file, *ca_pem);
  if (!cas.ok()) return cas.status();
  BioPtr key_bio = Bio(*key_pem);
  KeyPtr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  ERR_clear_error();
  if (key == nullptr) return Invalid("tls-key", s.key_file, "holds no PEM private key");
  X509* leaf = (*chain)[0].get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    ERR_clear_error();
    return Invalid(
        "tls-key", s.key_file,
        absl::StrCat("does not match the certificate in --tls-cert '", s.cert_file, "'"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(leaf)) <= 0) {
    return Invalid("tls-cert", s.cert_file, "has expired");
  }
  if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
    return Invalid("tls-cert", s.cert_file, "is not valid yet");
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> Provider(
    const TransportSecurity& s) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      s.key_file, s.cert_file, s.ca_file, static_cast<unsigned int>(s.reload_seconds));
}

}  // namespace

void DeclareTransportSecurityFlags(flags::FlagTable& table, TransportSecurity* security,
                                   bool client) {
  table.Section("transport security");
  const std::string peer = client ? "attention nodes" : "compute nodes";
  table.Text("tls-cert", &security->cert_file, "FILE",
             "PEM certificate (chain) this process presents; with --tls-key and --tls-ca turns on "
             "mutual TLS");
  table.Text("tls-key", &security->key_file, "FILE", "PEM private key of --tls-cert");
  table.Text("tls-ca", &security->ca_file, "FILE",
             absl::StrCat("PEM CA bundle that the ", peer, "' certificates must chain to"));
  table.Number("tls-reload-seconds", &security->reload_seconds,
               "how often the three files are checked for a rotation (new handshakes use the new "
               "files; no restart)",
               1, 86400, "SECONDS");
  if (client) {
    table.Text("tls-server-name", &security->server_name, "NAME",
               "the name checked against the attention nodes' certificates; empty: each "
               "address's host");
  }
  table.Switch("insecure", &security->insecure,
               "plaintext gRPC without authentication (logs a warning); only on a network you "
               "trust otherwise. Without it the --tls-* files are required");
}

absl::Status ValidateTransportSecurity(const TransportSecurity& s, std::string_view what) {
  const bool any = !s.cert_file.empty() || !s.key_file.empty() || !s.ca_file.empty();
  if (s.insecure) {
    if (any) {
      return absl::InvalidArgumentError(
          "--insecure and --tls-cert/--tls-key/--tls-ca exclude each other: choose one");
    }
    return absl::OkStatus();
  }
  if (!any) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(what),
        " needs transport security: give --tls-cert, --tls-key and --tls-ca (mutual TLS), or "
        "--insecure for plaintext on a network you trust"));
  }
  for (const auto& [flag, value] :
       {std::pair{"tls-cert", &s.cert_file}, std::pair{"tls-key", &s.key_file},
        std::pair{"tls-ca", &s.ca_file}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag,
                       " is missing: mutual TLS needs --tls-cert, --tls-key and "
                       "--tls-ca together"));
    }
  }
  return Validate(s);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const TransportSecurity& s) {
  if (absl::Status v = ValidateTransportSecurity(s, "the attention node"); !v.ok()) return v;
  if (s.insecure) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(s));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const TransportSecurity& s) {
  if (absl::Status v = ValidateTransportSecurity(s, "--attention-nodes"); !v.ok()) return v;
  if (s.insecure) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(s));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

grpc::ChannelArguments ChannelArgumentsFor(const TransportSecurity& s) {
  grpc::ChannelArguments args;
  if (!s.insecure && !s.server_name.empty()) args.SetSslTargetNameOverride(s.server_name);
  return args;
}

}  // namespace magicpig::fabric
