"""The config framework job and bot share: YAML with line numbers, the dataclass validator, ConfigError."""
