/* kernels/cuda/device.cu — device discovery and the cuBLAS handle for the
 * CUDA kernels. Any CUDA error means "no GPU" here (without a driver,
 * cudaGetDeviceCount returns cudaErrorInsufficientDriver, 35), so callers
 * fall back to the reference. Thread-safe (the CUDA runtime is).
 */
#include <cublas_v2.h>

#include "common.cuh"

extern "C" int kcuda_device_count(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		cudaGetLastError();
		return -ENODEV;
	}
	return n;
}

extern "C" int kcuda_blas_create(struct cublasContext **ret_blas)
{
	cublasHandle_t h;

	if (kcuda_device_count() < 0)
		return -ENODEV;
	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	/* The default math mode computes SGEMM in FP32 (TF32 only when
	 * asked for), so scores stay within the float dot-product bound of
	 * kernels.h; the GPU test would catch TF32 (2^-11 per product). */
	if (cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
		cublasDestroy(h);
		return -EIO;
	}
	*ret_blas = h;
	return 0;
}

extern "C" void kcuda_blas_destroy(struct cublasContext *blas)
{
	if (blas)
		cublasDestroy(blas);
}
