"""Profile -> plan: derivation, validation rules, port ledger, rendering. Pure functions only."""
