/*
 * emu_errors.c - cudaGetErrorName / cudaGetErrorString for the CUDA
 * emulator (tests/cuda_emu/).
 *
 * The names are the enumerators of enum cudaError in NVIDIA's
 * driver_types.h (CUDA 13 headers), listed by a script; the strings are our
 * own short wording, not NVIDIA's. Unknown values: cudaGetErrorName returns
 * "unrecognized error code", as the Runtime API reference says (CUDA
 * Runtime API, 6.4 Error Handling, cudaGetErrorName). Does not track errors:
 * see emu_runtime.c.
 */
#include <cuda_runtime_api.h>

#include "emu_core.h"

/* CUDA Runtime API, 6.4 Error Handling, cudaGetErrorName. */
const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError:
        return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading:
        return "cudaErrorCudartUnloading";
    case cudaErrorProfilerDisabled:
        return "cudaErrorProfilerDisabled";
    case cudaErrorProfilerNotInitialized:
        return "cudaErrorProfilerNotInitialized";
    case cudaErrorProfilerAlreadyStarted:
        return "cudaErrorProfilerAlreadyStarted";
    case cudaErrorProfilerAlreadyStopped:
        return "cudaErrorProfilerAlreadyStopped";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue:
        return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidSymbol:
        return "cudaErrorInvalidSymbol";
    case cudaErrorInvalidHostPointer:
        return "cudaErrorInvalidHostPointer";
    case cudaErrorInvalidDevicePointer:
        return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidTexture:
        return "cudaErrorInvalidTexture";
    case cudaErrorInvalidTextureBinding:
        return "cudaErrorInvalidTextureBinding";
    case cudaErrorInvalidChannelDescriptor:
        return "cudaErrorInvalidChannelDescriptor";
    case cudaErrorInvalidMemcpyDirection:
        return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorAddressOfConstant:
        return "cudaErrorAddressOfConstant";
    case cudaErrorTextureFetchFailed:
        return "cudaErrorTextureFetchFailed";
    case cudaErrorTextureNotBound:
        return "cudaErrorTextureNotBound";
    case cudaErrorSynchronizationError:
        return "cudaErrorSynchronizationError";
    case cudaErrorInvalidFilterSetting:
        return "cudaErrorInvalidFilterSetting";
    case cudaErrorInvalidNormSetting:
        return "cudaErrorInvalidNormSetting";
    case cudaErrorMixedDeviceExecution:
        return "cudaErrorMixedDeviceExecution";
    case cudaErrorNotYetImplemented:
        return "cudaErrorNotYetImplemented";
    case cudaErrorMemoryValueTooLarge:
        return "cudaErrorMemoryValueTooLarge";
    case cudaErrorStubLibrary:
        return "cudaErrorStubLibrary";
    case cudaErrorInsufficientDriver:
        return "cudaErrorInsufficientDriver";
    case cudaErrorCallRequiresNewerDriver:
        return "cudaErrorCallRequiresNewerDriver";
    case cudaErrorInvalidSurface:
        return "cudaErrorInvalidSurface";
    case cudaErrorDuplicateVariableName:
        return "cudaErrorDuplicateVariableName";
    case cudaErrorDuplicateTextureName:
        return "cudaErrorDuplicateTextureName";
    case cudaErrorDuplicateSurfaceName:
        return "cudaErrorDuplicateSurfaceName";
    case cudaErrorDevicesUnavailable:
        return "cudaErrorDevicesUnavailable";
    case cudaErrorIncompatibleDriverContext:
        return "cudaErrorIncompatibleDriverContext";
    case cudaErrorMissingConfiguration:
        return "cudaErrorMissingConfiguration";
    case cudaErrorPriorLaunchFailure:
        return "cudaErrorPriorLaunchFailure";
    case cudaErrorLaunchMaxDepthExceeded:
        return "cudaErrorLaunchMaxDepthExceeded";
    case cudaErrorLaunchFileScopedTex:
        return "cudaErrorLaunchFileScopedTex";
    case cudaErrorLaunchFileScopedSurf:
        return "cudaErrorLaunchFileScopedSurf";
    case cudaErrorSyncDepthExceeded:
        return "cudaErrorSyncDepthExceeded";
    case cudaErrorLaunchPendingCountExceeded:
        return "cudaErrorLaunchPendingCountExceeded";
    case cudaErrorInvalidDeviceFunction:
        return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorDeviceNotLicensed:
        return "cudaErrorDeviceNotLicensed";
    case cudaErrorSoftwareValidityNotEstablished:
        return "cudaErrorSoftwareValidityNotEstablished";
    case cudaErrorStartupFailure:
        return "cudaErrorStartupFailure";
    case cudaErrorInvalidKernelImage:
        return "cudaErrorInvalidKernelImage";
    case cudaErrorDeviceUninitialized:
        return "cudaErrorDeviceUninitialized";
    case cudaErrorMapBufferObjectFailed:
        return "cudaErrorMapBufferObjectFailed";
    case cudaErrorUnmapBufferObjectFailed:
        return "cudaErrorUnmapBufferObjectFailed";
    case cudaErrorArrayIsMapped:
        return "cudaErrorArrayIsMapped";
    case cudaErrorAlreadyMapped:
        return "cudaErrorAlreadyMapped";
    case cudaErrorNoKernelImageForDevice:
        return "cudaErrorNoKernelImageForDevice";
    case cudaErrorAlreadyAcquired:
        return "cudaErrorAlreadyAcquired";
    case cudaErrorNotMapped:
        return "cudaErrorNotMapped";
    case cudaErrorNotMappedAsArray:
        return "cudaErrorNotMappedAsArray";
    case cudaErrorNotMappedAsPointer:
        return "cudaErrorNotMappedAsPointer";
    case cudaErrorECCUncorrectable:
        return "cudaErrorECCUncorrectable";
    case cudaErrorUnsupportedLimit:
        return "cudaErrorUnsupportedLimit";
    case cudaErrorDeviceAlreadyInUse:
        return "cudaErrorDeviceAlreadyInUse";
    case cudaErrorPeerAccessUnsupported:
        return "cudaErrorPeerAccessUnsupported";
    case cudaErrorInvalidPtx:
        return "cudaErrorInvalidPtx";
    case cudaErrorInvalidGraphicsContext:
        return "cudaErrorInvalidGraphicsContext";
    case cudaErrorNvlinkUncorrectable:
        return "cudaErrorNvlinkUncorrectable";
    case cudaErrorJitCompilerNotFound:
        return "cudaErrorJitCompilerNotFound";
    case cudaErrorUnsupportedPtxVersion:
        return "cudaErrorUnsupportedPtxVersion";
    case cudaErrorJitCompilationDisabled:
        return "cudaErrorJitCompilationDisabled";
    case cudaErrorUnsupportedExecAffinity:
        return "cudaErrorUnsupportedExecAffinity";
    case cudaErrorUnsupportedDevSideSync:
        return "cudaErrorUnsupportedDevSideSync";
    case cudaErrorContained:
        return "cudaErrorContained";
    case cudaErrorInvalidSource:
        return "cudaErrorInvalidSource";
    case cudaErrorFileNotFound:
        return "cudaErrorFileNotFound";
    case cudaErrorSharedObjectSymbolNotFound:
        return "cudaErrorSharedObjectSymbolNotFound";
    case cudaErrorSharedObjectInitFailed:
        return "cudaErrorSharedObjectInitFailed";
    case cudaErrorOperatingSystem:
        return "cudaErrorOperatingSystem";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState:
        return "cudaErrorIllegalState";
    case cudaErrorLossyQuery:
        return "cudaErrorLossyQuery";
    case cudaErrorSymbolNotFound:
        return "cudaErrorSymbolNotFound";
    case cudaErrorNotReady:
        return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
        return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:
        return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchTimeout:
        return "cudaErrorLaunchTimeout";
    case cudaErrorLaunchIncompatibleTexturing:
        return "cudaErrorLaunchIncompatibleTexturing";
    case cudaErrorPeerAccessAlreadyEnabled:
        return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorPeerAccessNotEnabled:
        return "cudaErrorPeerAccessNotEnabled";
    case cudaErrorSetOnActiveProcess:
        return "cudaErrorSetOnActiveProcess";
    case cudaErrorContextIsDestroyed:
        return "cudaErrorContextIsDestroyed";
    case cudaErrorAssert:
        return "cudaErrorAssert";
    case cudaErrorTooManyPeers:
        return "cudaErrorTooManyPeers";
    case cudaErrorHostMemoryAlreadyRegistered:
        return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
        return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorHardwareStackError:
        return "cudaErrorHardwareStackError";
    case cudaErrorIllegalInstruction:
        return "cudaErrorIllegalInstruction";
    case cudaErrorMisalignedAddress:
        return "cudaErrorMisalignedAddress";
    case cudaErrorInvalidAddressSpace:
        return "cudaErrorInvalidAddressSpace";
    case cudaErrorInvalidPc:
        return "cudaErrorInvalidPc";
    case cudaErrorLaunchFailure:
        return "cudaErrorLaunchFailure";
    case cudaErrorCooperativeLaunchTooLarge:
        return "cudaErrorCooperativeLaunchTooLarge";
    case cudaErrorTensorMemoryLeak:
        return "cudaErrorTensorMemoryLeak";
    case cudaErrorNotPermitted:
        return "cudaErrorNotPermitted";
    case cudaErrorNotSupported:
        return "cudaErrorNotSupported";
    case cudaErrorSystemNotReady:
        return "cudaErrorSystemNotReady";
    case cudaErrorSystemDriverMismatch:
        return "cudaErrorSystemDriverMismatch";
    case cudaErrorCompatNotSupportedOnDevice:
        return "cudaErrorCompatNotSupportedOnDevice";
    case cudaErrorMpsConnectionFailed:
        return "cudaErrorMpsConnectionFailed";
    case cudaErrorMpsRpcFailure:
        return "cudaErrorMpsRpcFailure";
    case cudaErrorMpsServerNotReady:
        return "cudaErrorMpsServerNotReady";
    case cudaErrorMpsMaxClientsReached:
        return "cudaErrorMpsMaxClientsReached";
    case cudaErrorMpsMaxConnectionsReached:
        return "cudaErrorMpsMaxConnectionsReached";
    case cudaErrorMpsClientTerminated:
        return "cudaErrorMpsClientTerminated";
    case cudaErrorCdpNotSupported:
        return "cudaErrorCdpNotSupported";
    case cudaErrorCdpVersionMismatch:
        return "cudaErrorCdpVersionMismatch";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
        return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge:
        return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched:
        return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined:
        return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation:
        return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit:
        return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent:
        return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread:
        return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorTimeout:
        return "cudaErrorTimeout";
    case cudaErrorGraphExecUpdateFailure:
        return "cudaErrorGraphExecUpdateFailure";
    case cudaErrorExternalDevice:
        return "cudaErrorExternalDevice";
    case cudaErrorInvalidClusterSize:
        return "cudaErrorInvalidClusterSize";
    case cudaErrorFunctionNotLoaded:
        return "cudaErrorFunctionNotLoaded";
    case cudaErrorInvalidResourceType:
        return "cudaErrorInvalidResourceType";
    case cudaErrorInvalidResourceConfiguration:
        return "cudaErrorInvalidResourceConfiguration";
    case cudaErrorUnknown:
        return "cudaErrorUnknown";
    default:
        return "unrecognized error code";
    }
}

/* CUDA Runtime API, 6.4 Error Handling, cudaGetErrorString. */
const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInitializationError:
        return "initialization error";
    case cudaErrorCudartUnloading:
        return "driver shutting down";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
        return "invalid pitch argument";
    case cudaErrorInvalidSymbol:
        return "invalid device symbol";
    case cudaErrorInvalidHostPointer:
        return "invalid host pointer";
    case cudaErrorInvalidDevicePointer:
        return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
        return "invalid copy direction for memcpy";
    case cudaErrorSynchronizationError:
        return "incorrect use of synchronization";
    case cudaErrorMemoryValueTooLarge:
        return "value too large";
    case cudaErrorStubLibrary:
        return "CUDA driver is a stub library";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorDevicesUnavailable:
        return "CUDA-capable device(s) is/are busy or unavailable";
    case cudaErrorPriorLaunchFailure:
        return "unspecified launch failure in prior launch";
    case cudaErrorInvalidDeviceFunction:
        return "invalid device function";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorStartupFailure:
        return "startup failure in cuda runtime";
    case cudaErrorUnsupportedLimit:
        return "limit is not supported on this architecture";
    case cudaErrorPeerAccessUnsupported:
        return "peer access is not supported between these two devices";
    case cudaErrorOperatingSystem:
        return "OS call failed or operation not supported on this OS";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorIllegalState:
        return "the operation cannot be performed in the present state";
    case cudaErrorSymbolNotFound:
        return "named symbol not found";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
        return "too many resources requested for launch";
    case cudaErrorLaunchTimeout:
        return "the launch timed out and was terminated";
    case cudaErrorPeerAccessAlreadyEnabled:
        return "peer access is already enabled";
    case cudaErrorPeerAccessNotEnabled:
        return "peer access has not been enabled";
    case cudaErrorContextIsDestroyed:
        return "context is destroyed";
    case cudaErrorAssert:
        return "device-side assert triggered";
    case cudaErrorTooManyPeers:
        return "peer mapping resources exhausted";
    case cudaErrorHostMemoryAlreadyRegistered:
        return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
        return "pointer does not correspond to a registered memory region";
    case cudaErrorHardwareStackError:
        return "hardware stack error";
    case cudaErrorIllegalInstruction:
        return "an illegal instruction was encountered";
    case cudaErrorMisalignedAddress:
        return "misaligned address";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    case cudaErrorCooperativeLaunchTooLarge:
        return "too many blocks in cooperative launch";
    case cudaErrorNotPermitted:
        return "operation not permitted";
    case cudaErrorNotSupported:
        return "operation not supported";
    case cudaErrorTimeout:
        return "wait operation timed out";
    case cudaErrorUnknown:
        return "unknown error";
    default:
        break;
    }
    /* No wording of ours: the name says what it is. */
    return cudaGetErrorName(error);
}
