//! Data movement over packed row-major byte buffers of elements of `esize` bytes: permute
//! (transpose axes), concatenate and slice along an axis. Each has a naive reference doing index
//! arithmetic per element and a fast path copying the longest contiguous runs.
//!
//! Callers validate dims and buffer sizes; out-of-range reads or writes are skipped (never a
//! panic). Must not know about tensors.

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

fn copy_elem(src: &[u8], si: usize, dst: &mut [u8], di: usize, esize: usize) {
    if let (Some(s), Some(d)) = (
        src.get(si * esize..(si + 1) * esize),
        dst.get_mut(di * esize..(di + 1) * esize),
    ) {
        d.copy_from_slice(s);
    }
}

/// Reference permute: `out` dim `i` is `dims[perm[i]]`; every output element is located by
/// decomposing its index into coordinates.
pub fn permute_ref(src: &[u8], dims: &[usize], perm: &[usize], esize: usize, dst: &mut [u8]) {
    let out_dims: Vec<usize> = perm
        .iter()
        .map(|&p| dims.get(p).copied().unwrap_or(0))
        .collect();
    let in_str = strides(dims);
    let n: usize = out_dims.iter().product();
    for o in 0..n {
        let mut rem = o;
        let mut si = 0;
        for ax in (0..out_dims.len()).rev() {
            let c = rem % out_dims[ax];
            rem /= out_dims[ax];
            si += c * in_str.get(perm[ax]).copied().unwrap_or(0);
        }
        copy_elem(src, si, dst, o, esize);
    }
}

/// Fast permute: walks the output in order, copying whole runs when the last output axis is the
/// last input axis, else gathering along the last output axis.
pub fn permute(src: &[u8], dims: &[usize], perm: &[usize], esize: usize, dst: &mut [u8]) {
    let nd = perm.len();
    if nd == 0 || dims.len() != nd {
        return;
    }
    // drop size-1 axes and merge axes that stay adjacent (i, i+1 → consecutive in output)
    let out_dims: Vec<usize> = perm
        .iter()
        .map(|&p| dims.get(p).copied().unwrap_or(0))
        .collect();
    let in_str = strides(dims);
    let src_str: Vec<usize> = perm
        .iter()
        .map(|&p| in_str.get(p).copied().unwrap_or(0))
        .collect();
    let mut md: Vec<usize> = Vec::new();
    let mut ms: Vec<usize> = Vec::new();
    for (&d, &s) in out_dims.iter().zip(&src_str) {
        if d == 1 {
            continue;
        }
        if let (Some(ld), Some(ls)) = (md.last_mut(), ms.last_mut()) {
            if *ls == s * d {
                *ld *= d;
                *ls = s;
                continue;
            }
        }
        md.push(d);
        ms.push(s);
    }
    let total: usize = out_dims.iter().product();
    if md.is_empty() {
        let n = (total * esize).min(src.len()).min(dst.len());
        dst[..n].copy_from_slice(&src[..n]);
        return;
    }
    let k = md.len();
    let inner = md[k - 1];
    let inner_s = ms[k - 1];
    let outer = total / inner.max(1);
    let mut coord = vec![0usize; k - 1];
    let mut base = 0usize;
    for o in 0..outer {
        let d0 = o * inner;
        if inner_s == 1 {
            if let (Some(s), Some(d)) = (
                src.get(base * esize..(base + inner) * esize),
                dst.get_mut(d0 * esize..(d0 + inner) * esize),
            ) {
                d.copy_from_slice(s);
            }
        } else {
            match esize {
                4 => gather::<4>(src, base, inner_s, dst, d0, inner),
                2 => gather::<2>(src, base, inner_s, dst, d0, inner),
                _ => {
                    for j in 0..inner {
                        copy_elem(src, base + j * inner_s, dst, d0 + j, esize);
                    }
                }
            }
        }
        // advance the odometer over the outer axes
        for ax in (0..k - 1).rev() {
            coord[ax] += 1;
            base += ms[ax];
            if coord[ax] < md[ax] {
                break;
            }
            base -= ms[ax] * md[ax];
            coord[ax] = 0;
        }
    }
}

fn gather<const E: usize>(
    src: &[u8],
    base: usize,
    stride: usize,
    dst: &mut [u8],
    d0: usize,
    n: usize,
) {
    let Some(out) = dst.get_mut(d0 * E..(d0 + n) * E) else {
        return;
    };
    for (j, o) in out.chunks_exact_mut(E).enumerate() {
        let si = (base + j * stride) * E;
        if let Some(s) = src.get(si..si + E) {
            o.copy_from_slice(s);
        }
    }
}

/// Reference concatenation of `a` (dims `da`) and `b` (dims `db`) along `axis` (all other dims
/// equal), per element.
pub fn cat_ref(
    a: &[u8],
    da: &[usize],
    b: &[u8],
    db: &[usize],
    axis: usize,
    esize: usize,
    dst: &mut [u8],
) {
    let mut od = da.to_vec();
    let (Some(&na), Some(&nb)) = (da.get(axis), db.get(axis)) else {
        return;
    };
    od[axis] = na + nb;
    let (sa, sb) = (strides(da), strides(db));
    let n: usize = od.iter().product();
    let mut c = vec![0usize; od.len()];
    for o in 0..n {
        let mut rem = o;
        for ax in (0..od.len()).rev() {
            c[ax] = rem % od[ax];
            rem /= od[ax];
        }
        if c[axis] < na {
            let si: usize = c.iter().zip(&sa).map(|(x, s)| x * s).sum();
            copy_elem(a, si, dst, o, esize);
        } else {
            let si: usize = c
                .iter()
                .zip(&sb)
                .enumerate()
                .map(|(ax, (x, s))| if ax == axis { (x - na) * s } else { x * s })
                .sum();
            copy_elem(b, si, dst, o, esize);
        }
    }
}

/// Fast concatenation (same contract as [`cat_ref`]): one copy per outer index and input.
pub fn cat(
    a: &[u8],
    da: &[usize],
    b: &[u8],
    db: &[usize],
    axis: usize,
    esize: usize,
    dst: &mut [u8],
) {
    if axis >= da.len() || axis >= db.len() {
        return;
    }
    let outer: usize = da[..axis].iter().product();
    let ca = da[axis..].iter().product::<usize>() * esize;
    let cb = db[axis..].iter().product::<usize>() * esize;
    for o in 0..outer {
        let d0 = o * (ca + cb);
        if let (Some(s), Some(d)) = (a.get(o * ca..(o + 1) * ca), dst.get_mut(d0..d0 + ca)) {
            d.copy_from_slice(s);
        }
        if let (Some(s), Some(d)) = (
            b.get(o * cb..(o + 1) * cb),
            dst.get_mut(d0 + ca..d0 + ca + cb),
        ) {
            d.copy_from_slice(s);
        }
    }
}

/// Reference slice `start..end` of `axis`, per element.
pub fn split_ref(
    src: &[u8],
    dims: &[usize],
    axis: usize,
    start: usize,
    end: usize,
    esize: usize,
    dst: &mut [u8],
) {
    if axis >= dims.len() || end < start {
        return;
    }
    let mut od = dims.to_vec();
    od[axis] = end - start;
    let si_str = strides(dims);
    let n: usize = od.iter().product();
    for o in 0..n {
        let mut rem = o;
        let mut si = 0;
        for ax in (0..od.len()).rev() {
            let mut c = rem % od[ax];
            rem /= od[ax];
            if ax == axis {
                c += start;
            }
            si += c * si_str[ax];
        }
        copy_elem(src, si, dst, o, esize);
    }
}

/// Fast slice (same contract as [`split_ref`]): one copy per outer index.
pub fn split(
    src: &[u8],
    dims: &[usize],
    axis: usize,
    start: usize,
    end: usize,
    esize: usize,
    dst: &mut [u8],
) {
    if axis >= dims.len() || end < start {
        return;
    }
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product::<usize>() * esize;
    let cin = dims[axis] * inner;
    let cout = (end - start) * inner;
    for o in 0..outer {
        let s0 = o * cin + start * inner;
        if let (Some(s), Some(d)) = (
            src.get(s0..s0 + cout),
            dst.get_mut(o * cout..(o + 1) * cout),
        ) {
            d.copy_from_slice(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, esize: usize) -> Vec<u8> {
        (0..n * esize).map(|i| (i * 7 + i / 3) as u8).collect()
    }

    #[test]
    fn fast_matches_reference_on_awkward_shapes() {
        let cases: [(&[usize], &[usize]); 6] = [
            (&[3, 5, 7], &[1, 0, 2]),
            (&[3, 5, 7], &[2, 1, 0]),
            (&[2, 1, 9, 4], &[0, 2, 1, 3]),
            (&[4, 3, 2, 5], &[3, 2, 0, 1]),
            (&[33], &[0]),
            (&[6, 10], &[1, 0]),
        ];
        for esize in [2usize, 4, 3] {
            for (dims, perm) in cases {
                let n: usize = dims.iter().product();
                let src = bytes(n, esize);
                let (mut r, mut f) = (vec![0u8; n * esize], vec![1u8; n * esize]);
                permute_ref(&src, dims, perm, esize, &mut r);
                permute(&src, dims, perm, esize, &mut f);
                assert_eq!(f, r, "permute {dims:?} {perm:?} esize {esize}");
                for axis in 0..dims.len() {
                    let mut db = dims.to_vec();
                    db[axis] = 3;
                    let m: usize = db.iter().product();
                    let b = bytes(m, esize).iter().map(|x| x ^ 0x55).collect::<Vec<_>>();
                    let (mut r, mut f) = (vec![0u8; (n + m) * esize], vec![1u8; (n + m) * esize]);
                    cat_ref(&src, dims, &b, &db, axis, esize, &mut r);
                    cat(&src, dims, &b, &db, axis, esize, &mut f);
                    assert_eq!(f, r, "cat {dims:?} axis {axis}");
                    let (s, e) = (dims[axis] / 3, dims[axis]);
                    let k = n / dims[axis] * (e - s);
                    let (mut r, mut f) = (vec![0u8; k * esize], vec![1u8; k * esize]);
                    split_ref(&src, dims, axis, s, e, esize, &mut r);
                    split(&src, dims, axis, s, e, esize, &mut f);
                    assert_eq!(f, r, "split {dims:?} axis {axis}");
                }
            }
        }
    }

    #[test]
    fn transpose_by_hand() {
        let src: Vec<u8> = (0..6).collect(); // [[0,1,2],[3,4,5]]
        let mut d = vec![0u8; 6];
        permute_ref(&src, &[2, 3], &[1, 0], 1, &mut d);
        assert_eq!(d, [0, 3, 1, 4, 2, 5]);
    }
}
