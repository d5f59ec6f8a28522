"""NVIDIA NemotronLabs VoiceChat on MLX: the model, its step, mel, codes."""
