#include "common/metrics/metrics.h"

#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

namespace magicpig::metrics {

std::string Render(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120};
}

prometheus::Histogram::BucketBoundaries RpcBuckets() {
  return {5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 5};
}

prometheus::Histogram::BucketBoundaries RatioBuckets() {
  return {0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0};
}

prometheus::Histogram::BucketBoundaries CountBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256};
}

std::string_view Version() { return "0.5.0"; }

void AddBuildInfo(prometheus::Registry& registry, std::string_view node_kind) {
  prometheus::BuildGauge()
      .Name("magicpig_build_info")
      .Help("Build metadata of this process (value 1)")
      .Register(registry)
      .Add({{"version", std::string(Version())}, {"node_kind", std::string(node_kind)}})
      .Set(1);
}

prometheus::Gauge& NewGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Counter& NewCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Histogram& NewHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

}  // namespace magicpig::metrics
