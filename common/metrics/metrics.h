// Prometheus helpers shared by both node kinds: text exposition of a registry, the bucket sets the
// project's histograms use, and the build-info pseudo-metric.
//
// Every process owns one prometheus::Registry and passes it to the components that report (no
// global registry). These functions are thread-safe (prometheus-cpp's metrics and registry are).
#ifndef MAGICPIG_COMMON_METRICS_METRICS_H_
#define MAGICPIG_COMMON_METRICS_METRICS_H_

#include <string>
#include <string_view>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace magicpig::metrics {

// The Content-Type of the text exposition format.
inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

// The registry's metrics in the Prometheus text exposition format (version 0.0.4).
std::string Render(const prometheus::Registry& registry);

// Request-level latencies (time to first token, inter-token, end to end, queue): 1 ms .. 120 s.
prometheus::Histogram::BucketBoundaries LatencyBuckets();
// One RPC or attention step: 50 µs .. 5 s (the round trips of the design are 50 µs – 50 ms).
prometheus::Histogram::BucketBoundaries RpcBuckets();
// Ratios in [0, 1] (sampled fraction): finer near 0, where MagicPIG lives.
prometheus::Histogram::BucketBoundaries RatioBuckets();
// Counts (batch sizes): 1, 2, 4, .. 256.
prometheus::Histogram::BucketBoundaries CountBuckets();

// An unlabelled metric registered in `registry` (one family with one child): what most of the
// nodes' metrics are. The reference stays valid as long as the registry.
prometheus::Gauge& NewGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help);
prometheus::Counter& NewCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help);
prometheus::Histogram& NewHistogram(prometheus::Registry& registry, const std::string& name,
                                    const std::string& help,
                                    const prometheus::Histogram::BucketBoundaries& buckets);

// magicpig_build_info{version, node_kind} = 1.
void AddBuildInfo(prometheus::Registry& registry, std::string_view node_kind);

// The project version reported in build info and /v1/models.
std::string_view Version();

}  // namespace magicpig::metrics

#endif  // MAGICPIG_COMMON_METRICS_METRICS_H_
