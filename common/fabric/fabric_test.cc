// Transport security against real handshakes: a gRPC server (one generic method that answers OK)
// with ServerCredentials, clients with ChannelCredentials, certificates from scripts/dev-certs.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/fabric/call_identity.h"
#include "common/fabric/transport_security.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/dev_pki.h"

namespace magicpig::fabric {
namespace {

namespace fs = std::filesystem;

TransportSecurity Files(const testing::DevPki& pki, const std::string& who) {
  return pki.Security(who, /*reload_seconds=*/1);
}

// Answers every call OK at once.
class AnswerEverything final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
};

class FabricTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new testing::DevPki("one");
    pki2_ = new testing::DevPki("two");
  }
  static void TearDownTestSuite() {
    delete pki_;
    delete pki2_;
  }
  void SetUp() override {
    ASSERT_TRUE(pki_->ok()) << "scripts/dev-certs failed (is openssl installed?)";
    ASSERT_TRUE(pki2_->ok());
  }

  // A server that answers every call, on 127.0.0.1.
  std::unique_ptr<grpc::Server> Serve(const TransportSecurity& security, int* port) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = ServerCredentials(security);
    EXPECT_TRUE(creds.ok()) << creds.status();
    if (!creds.ok()) return nullptr;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *creds, port);
    builder.RegisterCallbackGenericService(&answer_);
    return builder.BuildAndStart();
  }

  // One call over `creds`: OK iff the handshake and the call succeed.
  static grpc::Status Check(int port, std::shared_ptr<grpc::ChannelCredentials> creds,
                            const grpc::ChannelArguments& args = {},
                            std::string host = "127.0.0.1") {
    auto channel = grpc::CreateCustomChannel(host + ":" + std::to_string(port), creds, args);
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("", 0);
    grpc::ByteBuffer request(&empty, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, "/test.Any/Call", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    return status;
  }

  static std::shared_ptr<grpc::ChannelCredentials> Client(const TransportSecurity& security) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = ChannelCredentials(security);
    EXPECT_TRUE(creds.ok()) << creds.status();
    return creds.ok() ? *creds : nullptr;
  }

  AnswerEverything answer_;
  static testing::DevPki* pki_;
  static testing::DevPki* pki2_;
};
testing::DevPki* FabricTest::pki_ = nullptr;
testing::DevPki* FabricTest::pki2_ = nullptr;

TEST_F(FabricTest, ChoosingNeitherModeIsAnError) {
  const absl::Status s = ValidateTransportSecurity(TransportSecurity{}, "the attention node");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--insecure"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--tls-cert"), std::string::npos) << s;
  TransportSecurity insecure;
  insecure.insecure = true;
  EXPECT_TRUE(ValidateTransportSecurity(insecure, "x").ok());
  TransportSecurity both = Files(*pki_, "node");
  both.insecure = true;
  EXPECT_NE(ValidateTransportSecurity(both, "x").message().find("exclude each other"),
            std::string::npos);
}

TEST_F(FabricTest, BadFilesAreNamed) {
  TransportSecurity s = Files(*pki_, "node");
  EXPECT_TRUE(ValidateTransportSecurity(s, "x").ok()) << ValidateTransportSecurity(s, "x");

  TransportSecurity no_key = s;
  no_key.key_file.clear();
  EXPECT_NE(ValidateTransportSecurity(no_key, "x").message().find("--tls-key is missing"),
            std::string::npos);

  TransportSecurity missing = s;
  missing.ca_file = pki_->dir() + "/nope.crt";
  EXPECT_NE(ValidateTransportSecurity(missing, "x").message().find("--tls-ca"), std::string::npos);
  EXPECT_NE(ValidateTransportSecurity(missing, "x").message().find("cannot be read"),
            std::string::npos);

  TransportSecurity wrong_key = s;
  wrong_key.key_file = pki_->dir() + "/other.key";
  const absl::Status mismatch = ValidateTransportSecurity(wrong_key, "x");
  EXPECT_NE(mismatch.message().find("does not match"), std::string::npos) << mismatch;

  TransportSecurity key_as_cert = s;
  key_as_cert.cert_file = s.key_file;
  EXPECT_NE(ValidateTransportSecurity(key_as_cert, "x").message().find("no PEM certificate"),
            std::string::npos);

  TransportSecurity cert_as_key = s;
  cert_as_key.key_file = s.cert_file;
  EXPECT_NE(ValidateTransportSecurity(cert_as_key, "x").message().find("no PEM private key"),
            std::string::npos);

  // The credential constructors validate too.
  EXPECT_FALSE(ServerCredentials(wrong_key).ok());
  EXPECT_FALSE(ChannelCredentials(TransportSecurity{}).ok());
}

TEST_F(FabricTest, OnlyClientsWithACertificateOfTheCaGetIn) {
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(Files(*pki_, "node"), &port);
  ASSERT_NE(server, nullptr);
  ASSERT_NE(port, 0);

  // The compute node's certificate: in.
  EXPECT_TRUE(Check(port, Client(Files(*pki_, "compute"))).ok());
  // The server checks the name: "localhost" is in the node's certificate, "127.0.0.2" is not
  // (the override names what to expect instead).
  EXPECT_TRUE(Check(port, Client(Files(*pki_, "compute")), {}, "localhost").ok());
  TransportSecurity renamed = Files(*pki_, "compute");
  renamed.server_name = "not-the-node.example";
  EXPECT_FALSE(Check(port, Client(renamed), ChannelArgumentsFor(renamed)).ok());

  // A certificate from another CA: out.
  TransportSecurity rogue = Files(*pki_, "rogue");
  rogue.ca_file = pki_->dir() + "/ca.crt";  // it trusts the node, the node does not trust it
  rogue.key_file = pki_->dir() + "/rogue.key";
  EXPECT_FALSE(Check(port, Client(rogue)).ok());
  // TLS without a client certificate: out.
  grpc::SslCredentialsOptions server_only;
  std::ifstream ca(pki_->dir() + "/ca.crt");
  server_only.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  EXPECT_FALSE(Check(port, grpc::SslCredentials(server_only)).ok());
  // Plaintext: out.
  EXPECT_FALSE(Check(port, grpc::InsecureChannelCredentials()).ok());
  // A client that does not trust the node's CA refuses it.
  TransportSecurity other_world = Files(*pki2_, "compute");
  EXPECT_FALSE(Check(port, Client(other_world)).ok());

  server->Shutdown();
}

TEST_F(FabricTest, RotatedFilesAreUsedWithoutARestart) {
  // The server's files in a directory of their own, replaced as Kubernetes does: atomically.
  const fs::path live = fs::path(pki_->dir()) / "live";
  fs::create_directories(live);
  auto install = [&](const std::string& from) {
    for (const char* name : {"node.crt", "node.key", "ca.crt"}) {
      fs::copy_file(fs::path(from) / name, live / (std::string(name) + ".new"),
                    fs::copy_options::overwrite_existing);
      fs::rename(live / (std::string(name) + ".new"), live / name);
    }
  };
  install(pki_->dir());
  TransportSecurity server_files;
  server_files.cert_file = (live / "node.crt").string();
  server_files.key_file = (live / "node.key").string();
  server_files.ca_file = (live / "ca.crt").string();
  server_files.reload_seconds = 1;
  int port = 0;
  std::unique_ptr<grpc::Server> server = Serve(server_files, &port);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(Check(port, Client(Files(*pki_, "compute"))).ok());
  EXPECT_FALSE(Check(port, Client(Files(*pki2_, "compute"))).ok());

  install(pki2_->dir());
  // Within a few reload periods the new PKI is in and the old one out (fresh channels).
  bool rotated = false;
  for (int i = 0; i < 50 && !rotated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    rotated = Check(port, Client(Files(*pki2_, "compute"))).ok();
  }
  EXPECT_TRUE(rotated) << "the rotated certificates were not picked up within 10 s";
  EXPECT_FALSE(Check(port, Client(Files(*pki_, "compute"))).ok());
  server->Shutdown();
}

TEST(CallIdentityTest, IncarnationsAreFreshAndTheHostNameIsTheDefaultInstance) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string hex = CallIdentity::RandomHex128();
    EXPECT_EQ(hex.size(), 32u);
    EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos) << hex;
    seen.insert(hex);
  }
  EXPECT_EQ(seen.size(), 100u);
  CallIdentity a("", ""), b("", "");
  EXPECT_FALSE(a.instance().empty());
  EXPECT_EQ(a.instance(), b.instance());
  EXPECT_NE(a.incarnation(), b.incarnation());
  EXPECT_EQ(CallIdentity("", "pod-7").instance(), "pod-7");
}

TEST(CallerTest, LogNamesNeverShowTheToken) {
  EXPECT_EQ((Caller{"token:s3cret", "", ""}.LogName()), "token");
  EXPECT_EQ((Caller{"x509:CN=compute", "", ""}.LogName()), "x509:CN=compute");
  EXPECT_EQ((Caller{"", "", ""}.LogName()), "-");
}

}  // namespace
}  // namespace magicpig::fabric
