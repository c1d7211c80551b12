//! The one integration test binary: each area is a module. Tests run the real `gpuwatch` binary
//! as subprocesses against the simulated NVML library (built once by `common::sim_lib`).

mod acceptance;
#[allow(dead_code)]
mod common;
mod config;
mod console;
mod control;
mod daemon;
mod digest;
mod doctor;
mod engine;
mod exporter;
mod fidelity;
mod fleet;
mod gpm;
mod import;
mod install;
mod job;
mod kubernetes;
mod layers;
mod metrics_doc;
mod mig;
mod notify;
mod nvlink;
mod outputs;
mod parsers;
mod real_driver;
mod real_gpu;
mod report;
mod restart;
mod service;
mod sim;
mod slurm;
mod top;
