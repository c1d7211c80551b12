//! Build script: gives the cdylib the soname of NVIDIA's library so it is a drop-in
//! `libnvidia-ml.so.1`, and binds its internal calls to itself (`-Bsymbolic`).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=scenarios");
}
