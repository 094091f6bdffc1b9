// Data movement: strided row copies (Split, Cat, CatDirect) and Permute.

// For o < outer: copy `chunk` units from src + o*sp to dst + o*dp (units of 4 bytes or 1 byte).
extern "C" __global__ void copy2d_u32(const unsigned int* src, unsigned int* dst, long outer, long chunk, long sp, long dp) {
    pdl_begin();
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < outer * chunk; id += (long)gridDim.x * blockDim.x) {
        long o = id / chunk, c = id % chunk;
        dst[o * dp + c] = src[o * sp + c];
    }
}

extern "C" __global__ void copy2d_u8(const unsigned char* src, unsigned char* dst, long outer, long chunk, long sp, long dp) {
    pdl_begin();
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < outer * chunk; id += (long)gridDim.x * blockDim.x) {
        long o = id / chunk, c = id % chunk;
        dst[o * dp + c] = src[o * sp + c];
    }
}

// Output element id (row-major over out dims) reads input at sum(coord[a] * strides[a]), where
// strides are the input strides of the permuted axes.
struct PermuteArgs {
    int ndim;
    long dims[8];
    long strides[8];
};

template <typename T>
__device__ void permute_t(const T* src, T* dst, long n, PermuteArgs a) {
    for (long id = (long)blockIdx.x * blockDim.x + threadIdx.x; id < n; id += (long)gridDim.x * blockDim.x) {
        long rem = id, off = 0;
        for (int ax = a.ndim - 1; ax >= 0; ax--) {
            long c = rem % a.dims[ax];
            rem /= a.dims[ax];
            off += c * a.strides[ax];
        }
        dst[id] = src[off];
    }
}

extern "C" __global__ void permute_b32(const unsigned int* src, unsigned int* dst, long n, PermuteArgs a) {
    pdl_begin();
    permute_t<unsigned int>(src, dst, n, a);
}

extern "C" __global__ void permute_b16(const unsigned short* src, unsigned short* dst, long n, PermuteArgs a) {
    pdl_begin();
    permute_t<unsigned short>(src, dst, n, a);
}
