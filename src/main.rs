//! The `gpuwatch` binary: all logic lives in the library; this only sets the exit code.

fn main() {
    std::process::exit(gpuwatch::cli::main());
}
