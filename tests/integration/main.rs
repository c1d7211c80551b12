//! Integration tests: one test binary, one module per area (`tests/integration/<area>.rs`).

mod engine;
