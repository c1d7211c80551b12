//! Build facts for `gpuwatch --version`, and the simulated NVML library (`nvml-sim`) embedded in
//! release builds so that `--sim` works from any install — `cargo install`, the wheel, the .deb —
//! without a second file beside the executable (it is loaded from memory, see
//! `sampler::embedded`).
//!
//! Which library is embedded:
//! - `GPUWATCH_SIM_LIB=/path/to/libnvml_sim.so`: that file (packagers who built it already);
//! - else, in a release build (`PROFILE=release`) of a source tree that has `nvml-sim/`: it is
//!   built here, by a nested `cargo build --release -p nvml-sim` into `target/sim-embed`
//!   (about a minute on two cores, once);
//! - `GPUWATCH_EMBED_SIM=0`, or a debug build: none (the test suite and `cargo run` use the
//!   library the workspace builds beside the executable).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=GPUWATCH_SIM_LIB");
    println!("cargo:rerun-if-env-changed=GPUWATCH_EMBED_SIM");
    println!("cargo:rerun-if-env-changed=GPUWATCH_GIT_COMMIT");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    println!(
        "cargo:rustc-env=GPUWATCH_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=GPUWATCH_GIT_COMMIT={}",
        git_commit(&manifest)
    );

    stock_rules(&manifest, &out);

    let embedded = out.join("libnvml_sim.so");
    match sim_library(&manifest, &out) {
        Ok(Some(lib)) => {
            println!("cargo:rerun-if-changed={}", lib.display());
            // (rewritten only when it changed: a new file would rebuild the crate)
            let same = std::fs::read(&lib).ok() == std::fs::read(&embedded).ok();
            if !same {
                if let Err(e) = std::fs::copy(&lib, &embedded) {
                    let _ = std::fs::remove_file(&embedded);
                    println!(
                        "cargo:warning=cannot copy {} to embed it: {e}",
                        lib.display()
                    );
                }
            }
        }
        Ok(None) => {
            let _ = std::fs::remove_file(&embedded);
        }
        Err(e) => {
            let _ = std::fs::remove_file(&embedded);
            println!(
                "cargo:warning=the simulated NVML library is not embedded (--sim then needs \
                 libnvml_sim.so beside the executable): {e}"
            );
        }
    }
    if embedded.is_file() {
        println!("cargo:rustc-cfg=gpuwatch_embedded_sim");
    }
    println!("cargo:rustc-check-cfg=cfg(gpuwatch_embedded_sim)");
}

/// `$OUT_DIR/stock_rules.rs`: the stock rule files (`rules/*.rhai`), name and text, so an
/// installed binary has them without the source tree (`rules::stock_rules_dir`).
fn stock_rules(manifest: &Path, out: &Path) {
    let dir = manifest.join("rules");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "rhai"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let mut code = String::from("/// The stock rule files: (file name, text).\npub static STOCK_RULES: &[(&str, &str)] = &[\n");
    for f in &files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            f.display().to_string()
        ));
    }
    code.push_str("];\n");
    let path = out.join("stock_rules.rs");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(code.as_str()) {
        std::fs::write(&path, code).expect("writing stock_rules.rs");
    }
}

/// The library to embed, if any (see the module docs).
fn sim_library(manifest: &Path, out: &Path) -> Result<Option<PathBuf>, String> {
    if let Some(lib) = std::env::var_os("GPUWATCH_SIM_LIB").filter(|v| !v.is_empty()) {
        let lib = PathBuf::from(lib);
        return if lib.is_file() {
            Ok(Some(lib))
        } else {
            Err(format!("GPUWATCH_SIM_LIB={} is not a file", lib.display()))
        };
    }
    if std::env::var("GPUWATCH_EMBED_SIM").is_ok_and(|v| v == "0")
        || std::env::var("PROFILE").as_deref() != Ok("release")
    {
        return Ok(None);
    }
    let sim = manifest.join("nvml-sim");
    if !sim.join("Cargo.toml").is_file() {
        return Err(format!("no nvml-sim sources under {}", manifest.display()));
    }
    // (the whole package: sources, scenarios, its build script) and the lock file
    println!("cargo:rerun-if-changed={}", sim.display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("Cargo.lock").display()
    );
    // target/release/build/gpuwatch-HASH/out → target/sim-embed (kept between builds)
    let target_dir = out
        .ancestors()
        .nth(4)
        .map_or_else(|| out.join("sim-embed"), |t| t.join("sim-embed"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--lib", "--manifest-path"])
        .arg(sim.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    if let Ok(target) = std::env::var("TARGET") {
        cmd.args(["--target", &target]);
    }
    // (a wrapper the outer build runs under, e.g. clippy's, is not for this one)
    for var in [
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run cargo to build nvml-sim: {e}"))?;
    if !status.success() {
        return Err(format!("building nvml-sim failed ({status})"));
    }
    let target = std::env::var("TARGET").unwrap_or_default();
    let lib = target_dir
        .join(&target)
        .join("release")
        .join("libnvml_sim.so");
    if lib.is_file() {
        Ok(Some(lib))
    } else {
        Err(format!("nvml-sim built, but {} is missing", lib.display()))
    }
}

/// The source tree's commit (`GPUWATCH_GIT_COMMIT` for builds outside a git checkout), or
/// "unknown".
fn git_commit(manifest: &Path) -> String {
    if let Ok(c) = std::env::var("GPUWATCH_GIT_COMMIT") {
        return c;
    }
    if manifest.join(".git").exists() {
        for f in ["HEAD", "index"] {
            println!(
                "cargo:rerun-if-changed={}",
                manifest.join(".git").join(f).display()
            );
        }
        if let Ok(o) = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(manifest)
            .output()
        {
            let c = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if o.status.success() && !c.is_empty() {
                let dirty = Command::new("git")
                    .args([
                        "--no-optional-locks",
                        "status",
                        "--porcelain",
                        "--untracked-files=no",
                    ])
                    .current_dir(manifest)
                    .output()
                    .is_ok_and(|o| !o.stdout.is_empty());
                return if dirty { format!("{c}-modified") } else { c };
            }
        }
    }
    "unknown".to_string()
}
