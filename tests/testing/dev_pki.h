// A throw-away PKI for tests of mutual TLS: scripts/dev-certs run into a fresh temporary
// directory (see that script for the files: ca, node, compute, other, rogue), removed with the
// object. Header-only, so tests of any library can use it. Test-only.
#ifndef MAGICPIG_TESTS_TESTING_DEV_PKI_H_
#define MAGICPIG_TESTS_TESTING_DEV_PKI_H_

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "common/fabric/transport_security.h"

namespace magicpig::testing {

class DevPki {
 public:
  // name goes into the subjects (two PKIs with different names are distinguishable). ok() is
  // false when the script failed (no openssl, no MAGICPIG_SOURCE_DIR).
  explicit DevPki(const std::string& name = "test") {
    const char* source = std::getenv("MAGICPIG_SOURCE_DIR");
    if (source == nullptr) return;
    std::random_device random;
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() /
        ("magicpig-pki-" + name + "-" + std::to_string(random()) + std::to_string(random()));
    const std::string command =
        std::string(source) + "/scripts/dev-certs " + dir.string() + " " + name + " >/dev/null";
    if (std::system(command.c_str()) == 0) dir_ = dir.string();
  }
  ~DevPki() {
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }
  DevPki(const DevPki&) = delete;
  DevPki& operator=(const DevPki&) = delete;

  bool ok() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // The files of `who` ("node", "compute", "other", "rogue"), trusting this PKI's CA.
  fabric::TransportSecurity Security(const std::string& who, int reload_seconds = 60) const {
    fabric::TransportSecurity s;
    s.cert_file = File(who + ".crt");
    s.key_file = File(who + ".key");
    s.ca_file = File("ca.crt");
    s.reload_seconds = reload_seconds;
    return s;
  }
  // The same as command-line flags.
  std::vector<std::string> Flags(const std::string& who) const {
    return {"--tls-cert",       File(who + ".crt"), "--tls-key",
            File(who + ".key"), "--tls-ca",         File("ca.crt")};
  }

 private:
  std::string dir_;
};

}  // namespace magicpig::testing

#endif  // MAGICPIG_TESTS_TESTING_DEV_PKI_H_
