//! The only module that talks to NVML (placeholder until implemented).
