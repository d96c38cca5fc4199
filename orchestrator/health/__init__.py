"""Deep health checks: parsers and verdicts for the check tools' outputs."""
