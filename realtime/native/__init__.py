"""The native ``/v1/realtime`` dialect: its rules (a state machine) and its wire."""
