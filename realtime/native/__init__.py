"""The native ``/v1/realtime`` dialect: its rules (a state machine), its wire, and its
connection (the rules on the one pipeline)."""
