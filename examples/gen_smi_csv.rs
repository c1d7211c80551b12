//! Writes a large nvidia-smi `--query-gpu --format=csv` log for the import benchmark
//! (`bench/import.sh`): 8 GPUs, one burst per second, rows a millisecond apart, the fields a
//! typical `nvidia-smi --query-gpu=timestamp,index,name,pci.bus_id,utilization.gpu,
//! utilization.memory,memory.used,memory.total,temperature.gpu,power.draw,clocks.sm -l 1` writes.
//!
//!     cargo run --release --example gen_smi_csv -- OUT.csv MEGABYTES

use std::io::Write as _;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: gen_smi_csv OUT.csv MEGABYTES");
    let megabytes: u64 = args.next().map_or(1000, |m| m.parse().expect("MEGABYTES"));
    let target = megabytes * 1_000_000;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
    let header = "timestamp, index, name, pci.bus_id, utilization.gpu [%], utilization.memory [%], \
                  memory.used [MiB], memory.total [MiB], temperature.gpu, power.draw [W], clocks.current.sm [MHz]\n";
    out.write_all(header.as_bytes())?;
    let mut written = header.len() as u64;
    // 2024-05-01T00:00:00Z, seconds.
    let start = 1_714_521_600i64;
    let mut line = String::with_capacity(256);
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut tick = 0i64;
    while written < target {
        let t = start + tick;
        let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
        let (y, m, d) = civil(days);
        for gpu in 0..8u32 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let util = state % 101;
            let mem = 20_000 + (state >> 8) % 60_000;
            let temp = 35 + (state >> 20) % 50;
            let power = 60.0 + ((state >> 30) % 34_000) as f64 / 100.0;
            let clock = 210 + (state >> 40) % 1200;
            line.clear();
            use std::fmt::Write as _;
            let _ = writeln!(
                line,
                "{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}.{:03}, {gpu}, NVIDIA A100-SXM4-80GB, 00000000:{:02X}:00.0, {util} %, {} %, {mem} MiB, 81920 MiB, {temp}, {power:.2} W, {clock} MHz",
                secs / 3600,
                (secs / 60) % 60,
                secs % 60,
                100 + gpu,
                7 + gpu * 8,
                util / 2
            );
            out.write_all(line.as_bytes())?;
            written += line.len() as u64;
        }
        tick += 1;
    }
    out.flush()?;
    eprintln!("{path}: {written} bytes, {tick} ticks of 8 GPUs");
    Ok(())
}

/// (year, month, day) of days since 1970-01-01.
fn civil(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
