//! Exported symbols that are not modelled: they answer NVML_ERROR_NOT_SUPPORTED (3).
//!
//! Clients treat a missing symbol as a driver/library mismatch but NOT_SUPPORTED as an ordinary
//! "N/A", so everything they look up is exported. The stubs ignore their arguments, which is
//! ABI-safe on x86_64 and aarch64 (the caller owns argument registers and stack).
//! `nvmlDeviceGetConfComputeMemSizeInfo` is deliberately absent (nvitop would switch to a
//! legacy process-struct layout).

use nvml_wrapper_sys::bindings::nvmlReturn_t;

use super::entry;
use crate::sim::{self, code};

macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> nvmlReturn_t {
                entry(stringify!($name), || {
                    sim::current()?;
                    Err(code::NOT_SUPPORTED)
                })
            }
        )*
        /// Names of every stub (for tests).
        #[cfg(test)]
        pub const STUBS: &[&str] = &[$(stringify!($name)),*];
    };
}

not_supported!(
    nvmlDeviceGetDriverModel,
    nvmlDeviceGetDriverModel_v2,
    nvmlDeviceGetDetailedEccErrors,
    nvmlDeviceGetViolationStatus,
    nvmlDeviceGetNvLinkUtilizationCounter,
    nvmlDeviceGetFanSpeedRPM,
    nvmlDeviceGetMinMaxFanSpeed,
    nvmlDeviceGetFanControlPolicy_v2,
    nvmlDeviceGetTargetFanSpeed,
    nvmlDeviceGetAccountingMode,
    nvmlDeviceGetAccountingPids,
    nvmlDeviceGetAccountingStats,
    nvmlDeviceGetAccountingBufferSize,
    nvmlDeviceGetEncoderStats,
    nvmlDeviceGetEncoderSessions,
    nvmlDeviceGetEncoderCapacity,
    nvmlDeviceGetFBCStats,
    nvmlDeviceGetFBCSessions,
    nvmlDeviceGetJpgUtilization,
    nvmlDeviceGetOfaUtilization,
    nvmlDeviceGetAutoBoostedClocksEnabled,
    nvmlDeviceGetGpuOperationMode,
    nvmlDeviceGetInforomVersion,
    nvmlDeviceGetInforomImageVersion,
    nvmlDeviceGetInforomConfigurationChecksum,
    nvmlDeviceGetBridgeChipInfo,
    nvmlDeviceGetCpuAffinity,
    nvmlDeviceGetCpuAffinityWithinScope,
    nvmlDeviceGetMemoryAffinity,
    nvmlDeviceGetTopologyCommonAncestor,
    nvmlDeviceGetTopologyNearestGpus,
    nvmlDeviceGetP2PStatus,
    nvmlDeviceGetSupportedMemoryClocks,
    nvmlDeviceGetSupportedGraphicsClocks,
    nvmlDeviceGetSupportedPerformanceStates,
    nvmlDeviceGetMaxCustomerBoostClock,
    nvmlDeviceGetMinMaxClockOfPState,
    nvmlDeviceGetClockOffsets,
    nvmlDeviceGetPerformanceModes,
    nvmlDeviceGetCurrentClockFreqs,
    nvmlDeviceGetPowerMizerMode_v1,
    nvmlDeviceGetGpcClkVfOffset,
    nvmlDeviceGetMemClkVfOffset,
    nvmlDeviceGetPowerSource,
    nvmlDeviceGetGspFirmwareMode,
    nvmlDeviceGetGspFirmwareVersion,
    nvmlDeviceGetVirtualizationMode,
    nvmlDeviceGetHostVgpuMode,
    nvmlDeviceGetAPIRestriction,
    nvmlDeviceGetNumGpuCores,
    nvmlDeviceGetIrqNum,
    nvmlDeviceGetMemoryBusWidth,
    nvmlDeviceGetBusType,
    nvmlDeviceGetPcieLinkMaxSpeed,
    nvmlDeviceGetPcieSpeed,
    nvmlDeviceGetBoardId,
    nvmlDeviceGetMultiGpuBoard,
    nvmlDeviceGetNumaNodeId,
    nvmlDeviceGetAttributes_v2,
    nvmlDeviceGetRowRemapperHistogram,
    nvmlDeviceGetThermalSettings,
    nvmlDeviceGetSramEccErrorStatus,
    nvmlDeviceGetDynamicPstatesInfo,
    nvmlDeviceGetProcessesUtilizationInfo,
    nvmlDeviceGetSupportedVgpus,
    nvmlDeviceGetCreatableVgpus,
    nvmlDeviceGetActiveVgpus,
    nvmlDeviceGetVgpuCapabilities,
    nvmlDeviceGetVgpuSchedulerLog,
    nvmlDeviceGetVgpuSchedulerState,
    nvmlDeviceGetC2cModeInfoV,
    nvmlDeviceGetModuleId,
    nvmlDeviceGetPowerUsage_v2,
    nvmlDeviceGetMarginTemperature,
    nvmlDeviceOnSameBoard,
    nvmlDeviceValidateInforom,
    nvmlDeviceQueryDrainState,
    nvmlSystemGetTopologyGpuSet,
    nvmlSystemGetHicVersion,
    nvmlSystemGetConfComputeState,
    nvmlSystemGetConfComputeCapabilities,
    nvmlSystemGetConfComputeSettings,
    nvmlSystemGetNvlinkBwMode,
    nvmlGetVgpuDriverCapabilities,
    nvmlGetVgpuVersion,
    nvmlGetExcludedDeviceInfoByIndex,
    nvmlUnitGetHandleByIndex,
    nvmlUnitGetUnitInfo,
    nvmlUnitGetLedState,
    nvmlUnitGetPsuInfo,
    nvmlUnitGetTemperature,
    nvmlUnitGetFanSpeedInfo,
    nvmlUnitGetDevices,
);

#[cfg(test)]
mod tests {
    use super::STUBS;

    #[test]
    fn conf_compute_mem_size_info_is_never_exported() {
        assert!(!STUBS.contains(&"nvmlDeviceGetConfComputeMemSizeInfo"));
        assert!(!STUBS.contains(&"nvmlDeviceGetRunningProcessDetailList"));
        assert!(STUBS.contains(&"nvmlDeviceGetDriverModel_v2"));
    }
}
