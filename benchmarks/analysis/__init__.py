"""Post-processing of benchmark JSON: A/B ratios between runs (ab_compare) and merged runs (merge_bench)."""
