"""qpa_operator: the kopf operator that reconciles the five qpa custom resources."""
