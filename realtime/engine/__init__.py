"""The engine: one thread for all MLX work, its scheduler and admission."""
