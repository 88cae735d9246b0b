// The data a `qeval triage` report holds: plain values, independent of how they were produced.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reports/compare_report_model.h"
#include "reports/report_header.h"
#include "reports/run_report_model.h"  // Artifact, MetricInfo

namespace qeval::reports {

inline constexpr const char* kTriageReportSchemaVersion = "1.1";

// One quantized node of the triaged variant.
struct TriageNode {
  std::string model, name, op, category;
  std::size_t order = 0;  // topological position among the variant's quantized nodes (model order)
  // Its own (local) error in the full variant: the node with its Q/DQ on the reference's inputs.
  std::optional<double> local_sqnr_db, local_rel_l2;
  // The output metric (mean over samples) with only this node quantized, and with every other
  // node quantized and this one kept in high precision; empty when not measured (--rank local).
  std::optional<double> metric_only_quantized, metric_only_kept;
  double score = 0;            // what the greedy search ranks by (higher = more to blame)
  std::size_t rank_local = 0;  // 1 = worst local SQNR
  std::size_t rank = 0;        // 1 = first to keep in high precision
};

// One configuration a search evaluated.
struct TriageStep {
  std::size_t kept = 0;  // nodes kept in high precision
  std::optional<double> metric;
  bool passed = false;
  std::string note;  // e.g. "added /stage2/.../MatMul", "bisect 12 of 47"
};

// One search for the smallest set of nodes to keep in high precision.
struct TriageSearch {
  std::string strategy;           // "greedy" | "bisect-topological" | "bisect-ranked"
  std::string description;        // how it searched
  bool passed = false;            // found a set that passes the gate
  std::vector<std::string> kept;  // node names, topological order
  std::size_t runs = 0;           // configurations evaluated (each: the variant over every sample)
  std::optional<double> metric;   // of the final set
  double elapsed_s = 0;
  std::vector<TriageStep> steps;
};

struct TriageReport : ReportHeader {
  std::string pipeline;  // "segmentation", ...
  Artifact model, inputs, recipe;
  std::string variant, reference;
  std::string precision;  // of what the recipe leaves in float (the high precision nodes fall back to)
  std::size_t samples = 0;
  MetricInfo metric;  // what ranks the nodes and the searches report
  std::string gate_source;
  std::string rank_by;  // "sensitivity" | "local"
  // The variant as given and with every node in high precision.
  std::optional<double> metric_full, metric_none;
  bool full_passed = false, none_passed = false;
  GateSection gate_full;          // the gate's checks on the variant as given
  GateSection gate_chosen;        // the gate's checks on the chosen fallback
  std::size_t ranking_runs = 0;   // configurations evaluated to rank (2 per node with sensitivity)
  std::vector<TriageNode> nodes;  // rank order
  std::vector<TriageSearch> searches;
  std::string chosen;        // the search whose set the override recipe keeps ("" = none)
  Artifact override_recipe;  // the written recipe (name, file, fingerprint)
  double elapsed_s = 0;
  std::vector<std::pair<std::string, std::string>> settings;

  const TriageSearch* chosen_search() const {  // nullptr when none passed
    for (const auto& s : searches)
      if (s.strategy == chosen) return &s;
    return nullptr;
  }
  // The chosen search's nodes (those the override recipe keeps in high precision); empty if none.
  const std::vector<std::string>& kept() const {
    static const std::vector<std::string> none;
    const TriageSearch* s = chosen_search();
    return s ? s->kept : none;
  }
};

}  // namespace qeval::reports
