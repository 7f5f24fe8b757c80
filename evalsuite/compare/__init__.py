"""Token parity between an engine and the reference: metrics, diff, bisection."""
