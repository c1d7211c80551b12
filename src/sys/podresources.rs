//! The kubelet's PodResources API: which pod, namespace and container each GPU is allocated to.
//!
//! The kubelet serves gRPC (`v1.PodResourcesLister/List`) on a Unix socket,
//! `/var/lib/kubelet/pod-resources/kubelet.sock` by default; a process that can open it (root,
//! or a pod that mounts the directory) gets every pod's devices. The NVIDIA device plugin's
//! device ids are the GPU's UUID (`GPU-…`), a MIG device's UUID (`MIG-…`, resource
//! `nvidia.com/mig-<profile>` under the mixed strategy) or, for time-sliced and MPS replicas, the
//! same with `::N` after it. dcgm-exporter labels GPU series with `pod`, `namespace` and
//! `container` from the same call; gpuwatch does the same, and names the pod of a process on a
//! GPU allocated to one pod (its cgroup has only the pod's uid).
//!
//! The call is small and made by hand: HTTP/2 from the `h2` crate, the gRPC framing (a flag
//! byte, a 4-byte length, the message; `grpc-status` in the trailers) and a protobuf reader for
//! the few fields used (unknown fields skipped, as protobuf requires). A [`Watcher`] thread
//! repeats it every [`Watcher::EVERY`], so a slow or absent kubelet never holds the sampler.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The kubelet's socket where it is by default.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// `[kubernetes]` in the config file.
#[derive(Debug, Clone, serde::Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSection {
    /// The kubelet's PodResources socket, used while it exists; `""` = never.
    pub pod_resources: PathBuf,
}

impl Default for KubernetesSection {
    fn default() -> Self {
        KubernetesSection {
            pod_resources: PathBuf::from(DEFAULT_SOCKET),
        }
    }
}

impl KubernetesSection {
    /// The socket to watch, if any.
    pub fn socket(&self) -> Option<&Path> {
        (!self.pod_resources.as_os_str().is_empty()).then_some(self.pod_resources.as_path())
    }
}

/// One device of one container.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Allocation {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The extended resource (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …).
    pub resource: String,
    /// The device's UUID (`GPU-…`, `MIG-…`), without a replica's `::N`.
    pub uuid: String,
}

/// The largest answer read (a node with thousands of pods stays far below it).
const MAX_ANSWER: usize = 16 << 20;

/// Asks the kubelet at `socket` for every pod's devices, within `timeout`; the GPU and MIG
/// devices among them.
pub fn list(socket: &Path, timeout: Duration) -> Result<Vec<Allocation>, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    let message = rt.block_on(async {
        match tokio::time::timeout(timeout, call(socket)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "{}: no answer within {} ms",
                socket.display(),
                timeout.as_millis()
            )),
        }
    })?;
    decode_list(&message)
        .map_err(|e| format!("{}: the answer is not a pod list: {e}", socket.display()))
}

/// One `List` call: the response message's bytes.
async fn call(socket: &Path) -> Result<Vec<u8>, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", socket.display());
    let io = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| at(&e))?;
    let (client, connection) = h2::client::handshake(io).await.map_err(|e| at(&e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let result = async {
        let mut client = client.ready().await.map_err(|e| at(&e))?;
        let request = http::Request::builder()
            .method("POST")
            .uri("http://localhost/v1.PodResourcesLister/List")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| at(&e))?;
        let (response, mut send) = client.send_request(request, false).map_err(|e| at(&e))?;
        // an empty ListPodResourcesRequest: not compressed, length 0
        send.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .map_err(|e| at(&e))?;
        let response = response.await.map_err(|e| at(&e))?;
        let (parts, mut body) = response.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(at(&format!("HTTP status {}", parts.status)));
        }
        // an error comes "trailers-only", in the headers
        grpc_status(&parts.headers).map_err(|e| at(&e))?;
        let mut buf = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| at(&e))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            buf.extend_from_slice(&chunk);
            if buf.len() > MAX_ANSWER {
                return Err(at(&format!("an answer over {MAX_ANSWER} bytes")));
            }
        }
        if let Some(trailers) = body.trailers().await.map_err(|e| at(&e))? {
            grpc_status(&trailers).map_err(|e| at(&e))?;
        }
        unframe(&buf).map_err(|e| at(&e))
    }
    .await;
    driver.abort();
    result
}

/// `Err` with gRPC's status and message when `grpc-status` is there and not 0.
fn grpc_status(headers: &http::HeaderMap) -> Result<(), String> {
    match headers.get("grpc-status").and_then(|v| v.to_str().ok()) {
        None | Some("0") => Ok(()),
        Some(code) => {
            let message = headers
                .get("grpc-message")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            Err(format!("gRPC status {code} {message}")
                .trim_end()
                .to_string())
        }
    }
}

/// The one message of a gRPC response body.
fn unframe(buf: &[u8]) -> Result<Vec<u8>, String> {
    let Some((head, rest)) = buf.split_first_chunk::<5>() else {
        return Err("an empty answer".into());
    };
    if head[0] != 0 {
        return Err("a compressed answer (none was asked for)".into());
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    rest.get(..len)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| format!("an answer cut short ({} of {len} bytes)", rest.len()))
}

/// A protobuf field's value.
enum Wire<'a> {
    Varint,
    Bytes(&'a [u8]),
    Fixed,
}

/// Reads the fields of one protobuf message.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn of(message: &'a [u8]) -> Fields<'a> {
        Fields { rest: message }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.rest.split_first().ok_or("a varint cut short")?;
            self.rest = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint over 10 bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err("a field cut short".into());
        }
        let (v, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(v)
    }

    /// The next field: its number and value; `None` at the end.
    fn next_field(&mut self) -> Result<Option<(u64, Wire<'a>)>, String> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => {
                self.varint()?;
                Wire::Varint
            }
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "a length too large")?;
                Wire::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            t => return Err(format!("wire type {t} (groups are not used by this API)")),
        };
        Ok(Some((key >> 3, value)))
    }
}

/// The longest name or id read (Kubernetes names are at most 253 bytes).
const MAX_TEXT: usize = 1024;
/// The most GPU and MIG devices read from one answer.
const MAX_DEVICES: usize = 65_536;

fn text(b: &[u8]) -> Result<String, String> {
    if b.len() > MAX_TEXT {
        return Err(format!("a name of {} bytes", b.len()));
    }
    String::from_utf8(b.to_vec()).map_err(|_| "a string that is not UTF-8".to_string())
}

/// Decodes a `ListPodResourcesResponse` (`pod_resources` = 1) into the GPU and MIG devices.
pub fn decode_list(message: &[u8]) -> Result<Vec<Allocation>, String> {
    let mut out = Vec::new();
    let mut f = Fields::of(message);
    while let Some((n, v)) = f.next_field()? {
        if let (1, Wire::Bytes(pod)) = (n, v) {
            decode_pod(pod, &mut out)?;
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `PodResources`: name = 1, namespace = 2, containers = 3.
fn decode_pod(message: &[u8], out: &mut Vec<Allocation>) -> Result<(), String> {
    let (mut name, mut namespace) = (String::new(), String::new());
    let mut containers = Vec::new();
    let mut f = Fields::of(message);
    while let Some((n, v)) = f.next_field()? {
        match (n, v) {
            (1, Wire::Bytes(b)) => name = text(b)?,
            (2, Wire::Bytes(b)) => namespace = text(b)?,
            (3, Wire::Bytes(b)) => containers.push(b),
            _ => {}
        }
    }
    for c in containers {
        // ContainerResources: name = 1, devices = 2
        let mut container = String::new();
        let mut devices = Vec::new();
        let mut f = Fields::of(c);
        while let Some((n, v)) = f.next_field()? {
            match (n, v) {
                (1, Wire::Bytes(b)) => container = text(b)?,
                (2, Wire::Bytes(b)) => devices.push(b),
                _ => {}
            }
        }
        for d in devices {
            // ContainerDevices: resource_name = 1, device_ids = 2 (repeated)
            let mut resource = String::new();
            let mut ids = Vec::new();
            let mut f = Fields::of(d);
            while let Some((n, v)) = f.next_field()? {
                match (n, v) {
                    (1, Wire::Bytes(b)) => resource = text(b)?,
                    (2, Wire::Bytes(b)) => ids.push(text(b)?),
                    _ => {}
                }
            }
            for id in ids {
                let uuid = id.split_once("::").map_or(id.as_str(), |(u, _)| u);
                if uuid.starts_with("GPU-") || uuid.starts_with("MIG-") {
                    if out.len() >= MAX_DEVICES {
                        return Err(format!("over {MAX_DEVICES} GPU devices"));
                    }
                    out.push(Allocation {
                        namespace: namespace.clone(),
                        pod: name.clone(),
                        container: container.clone(),
                        resource: resource.clone(),
                        uuid: uuid.to_string(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The latest allocations, read by a thread of its own every [`Watcher::EVERY`] while the
/// socket exists.
#[derive(Debug, Clone)]
pub struct Watcher {
    latest: Arc<Mutex<Option<Arc<Vec<Allocation>>>>>,
}

impl Watcher {
    /// How often the kubelet is asked.
    pub const EVERY: Duration = Duration::from_secs(10);
    /// How long one call may take.
    pub const TIMEOUT: Duration = Duration::from_secs(5);

    /// Starts watching `socket`. The first answer is waited for (at most
    /// [`Watcher::TIMEOUT`]) when the socket exists, so a one-shot command names pods too.
    pub fn start(socket: PathBuf) -> Watcher {
        let w = Watcher {
            latest: Arc::new(Mutex::new(None)),
        };
        let mut said = None;
        w.poll(&socket, &mut said);
        let me = w.clone();
        let spawned = std::thread::Builder::new()
            .name("podresources".into())
            .spawn(move || loop {
                std::thread::sleep(Self::EVERY);
                me.poll(&socket, &mut said);
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the PodResources thread: {e}; pods are not named");
        }
        w
    }

    /// One call: its answer replaces the last; a failure clears it (a stale allocation would
    /// name the wrong pod), said once until a call succeeds again.
    fn poll(&self, socket: &Path, said: &mut Option<String>) {
        if !socket.exists() {
            self.set(None);
            return;
        }
        match list(socket, Self::TIMEOUT) {
            Ok(a) => {
                // ("" = the success was said)
                if said.as_deref() != Some("") {
                    tracing::info!(
                        socket = %socket.display(),
                        devices = a.len(),
                        "naming pods through the kubelet's PodResources API"
                    );
                    *said = Some(String::new());
                }
                self.set(Some(Arc::new(a)));
            }
            Err(e) => {
                if said.as_deref() != Some(e.as_str()) {
                    tracing::warn!("PodResources: {e}; GPU processes are named by pod uid only");
                    *said = Some(e);
                }
                self.set(None);
            }
        }
    }

    fn set(&self, v: Option<Arc<Vec<Allocation>>>) {
        if let Ok(mut l) = self.latest.lock() {
            *l = v;
        }
    }

    /// The latest allocations (`None` without an answer).
    pub fn current(&self) -> Option<Arc<Vec<Allocation>>> {
        self.latest.lock().ok().and_then(|l| l.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A protobuf field: key and length-delimited bytes.
    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let push_varint = |mut v: u64, out: &mut Vec<u8>| loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        };
        push_varint((n << 3) | 2, &mut out);
        push_varint(bytes.len() as u64, &mut out);
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn gpu_and_mig_devices_are_read_and_unknown_fields_skipped() {
        let gpu = "GPU-11111111-2222-3333-4444-555555555555";
        let devices = [
            field(1, b"nvidia.com/gpu"),
            field(2, format!("{gpu}::1").as_bytes()),
            // an unknown varint field (99) and fixed32 (98): skipped
            vec![0x98, 0x06, 0x2a, 0x95, 0x06, 1, 2, 3, 4],
        ]
        .concat();
        let mig = [field(1, b"nvidia.com/mig-1g.10gb"), field(2, b"MIG-abc")].concat();
        let cpu = [field(1, b"example.com/fpga"), field(2, b"fpga0")].concat();
        let container = [
            field(1, b"trainer"),
            field(2, &devices),
            field(2, &mig),
            field(2, &cpu),
            // cpu_ids, packed
            field(3, &[2, 3]),
        ]
        .concat();
        let sidecar = field(1, b"sidecar");
        let pod = [
            field(1, b"trainer-0"),
            field(2, b"ml"),
            field(3, &sidecar),
            field(3, &container),
        ]
        .concat();
        let list = decode_list(&field(1, &pod)).unwrap();
        let got: Vec<(&str, &str, &str, &str)> = list
            .iter()
            .map(|a| {
                (
                    a.namespace.as_str(),
                    a.pod.as_str(),
                    a.container.as_str(),
                    a.uuid.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("ml", "trainer-0", "trainer", gpu),
                ("ml", "trainer-0", "trainer", "MIG-abc")
            ]
        );
        assert!(decode_list(&[0x0a, 0x05, 1]).is_err(), "cut short");
        assert!(decode_list(&[0x0b]).is_err(), "a group");
        assert_eq!(decode_list(&[]).unwrap(), Vec::new());
        // a hostile answer: a name far over Kubernetes' limits is refused, not copied per device
        let huge = [field(1, &vec![b'a'; 4096]), field(3, &container)].concat();
        assert!(decode_list(&field(1, &huge)).is_err());
    }

    #[test]
    fn grpc_frames_and_statuses() {
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 7, 8]).unwrap(), vec![7, 8]);
        assert!(unframe(&[0, 0, 0, 0, 3, 7]).is_err());
        assert!(unframe(&[1, 0, 0, 0, 0]).is_err());
        assert!(unframe(&[]).is_err());
        let mut h = http::HeaderMap::new();
        assert!(grpc_status(&h).is_ok());
        h.insert("grpc-status", "7".parse().unwrap());
        h.insert("grpc-message", "permission denied".parse().unwrap());
        assert_eq!(
            grpc_status(&h).unwrap_err(),
            "gRPC status 7 permission denied"
        );
    }
}
