//! NVML return codes: names (for scenario files and debug logs) and `nvmlErrorString` texts.

use std::ffi::c_char;

/// (code, name without the `NVML_ERROR_` prefix, NUL-terminated description).
const CODES: &[(u32, &str, &str)] = &[
    (0, "SUCCESS", "Success\0"),
    (1, "UNINITIALIZED", "Uninitialized\0"),
    (2, "INVALID_ARGUMENT", "Invalid Argument\0"),
    (3, "NOT_SUPPORTED", "Not Supported\0"),
    (4, "NO_PERMISSION", "Insufficient Permissions\0"),
    (5, "ALREADY_INITIALIZED", "Already Initialized\0"),
    (6, "NOT_FOUND", "Not Found\0"),
    (7, "INSUFFICIENT_SIZE", "Insufficient Size\0"),
    (8, "INSUFFICIENT_POWER", "Insufficient External Power\0"),
    (9, "DRIVER_NOT_LOADED", "Driver Not Loaded\0"),
    (10, "TIMEOUT", "Timeout\0"),
    (11, "IRQ_ISSUE", "Interrupt Request Issue\0"),
    (12, "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found\0"),
    (13, "FUNCTION_NOT_FOUND", "Function Not Found\0"),
    (14, "CORRUPTED_INFOROM", "Corrupted infoROM\0"),
    (15, "GPU_IS_LOST", "GPU is lost\0"),
    (16, "RESET_REQUIRED", "GPU requires restart\0"),
    (
        17,
        "OPERATING_SYSTEM",
        "The operating system has blocked the request.\0",
    ),
    (
        18,
        "LIB_RM_VERSION_MISMATCH",
        "RM has detected an NVML/RM version mismatch.\0",
    ),
    (19, "IN_USE", "In use by another client\0"),
    (20, "MEMORY", "Insufficient Memory\0"),
    (21, "NO_DATA", "No data\0"),
    (
        22,
        "VGPU_ECC_NOT_SUPPORTED",
        "The requested vgpu operation is not available on target device, because ECC is enabled\0",
    ),
    (
        23,
        "INSUFFICIENT_RESOURCES",
        "Ran out of critical resources, other than memory\0",
    ),
    (
        24,
        "FREQ_NOT_SUPPORTED",
        "The requested frequency is not supported\0",
    ),
    (
        25,
        "ARGUMENT_VERSION_MISMATCH",
        "Version mismatch between the provided argument and the expected struct\0",
    ),
    (
        26,
        "DEPRECATED",
        "The requested functionality has been deprecated\0",
    ),
    (27, "NOT_READY", "The system is not ready for the request\0"),
    (28, "GPU_NOT_FOUND", "No GPUs were found\0"),
    (
        29,
        "INVALID_STATE",
        "Resource not in correct state to perform requested operation\0",
    ),
    (999, "UNKNOWN", "Unknown Error\0"),
];

/// Looks up a code by name: `NOT_SUPPORTED`, `not_supported` or `NVML_ERROR_NOT_SUPPORTED`.
pub fn code_by_name(name: &str) -> Option<u32> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper
        .strip_prefix("NVML_ERROR_")
        .or_else(|| upper.strip_prefix("NVML_"))
        .unwrap_or(&upper);
    CODES.iter().find(|c| c.1 == bare).map(|c| c.0)
}

/// The name of a code, for logs.
pub fn name_of(code: u32) -> &'static str {
    CODES
        .iter()
        .find(|c| c.0 == code)
        .map(|c| c.1)
        .unwrap_or("?")
}

/// A static NUL-terminated description, as `nvmlErrorString` returns.
pub fn description(code: u32) -> *const c_char {
    let text = CODES
        .iter()
        .find(|c| c.0 == code)
        .map(|c| c.2)
        .unwrap_or("Unknown Error\0");
    text.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        assert_eq!(code_by_name("not_supported"), Some(3));
        assert_eq!(code_by_name("NVML_ERROR_GPU_IS_LOST"), Some(15));
        assert_eq!(code_by_name("bogus"), None);
        assert_eq!(name_of(25), "ARGUMENT_VERSION_MISMATCH");
        assert!(CODES.iter().all(|c| c.2.ends_with('\0')));
    }
}
