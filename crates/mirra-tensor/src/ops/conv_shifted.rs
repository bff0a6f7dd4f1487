//! Stride-1 convolutions as matrix products of shifted views of the padded input: no
//! patches are written (`im2col` copies every input element once per tap).
//!
//! Lay the input out zero-padded on a grid of `p1 x p2 x p3` positions per image (its
//! padded size, `p = output + kernel - 1` for stride 1) and give the output the same
//! grid, its positions at the grid's origin corner. Output position `g` of the flat grid
//! then reads input position `g + off(t)` for tap `t = (t1, t2, t3)`, with `off(t) = (t1 ·
//! p2 + t2) · p3 + t3`, for every image at once. The taps of one `(t1, t2)` along the
//! last dimension are consecutive grid positions, and their channels consecutive
//! elements, so `[rows, k3 · c]` with row stride `c` is a view of the padded input, not a
//! copy: the forward pass is `k1 · k2` products `out += view(t1, t2) · kernel(t1, t2)`.
//! The gradients are two more of the same kind:
//!
//! - input: the output gradient on the grid, after `reach = off(k - 1)` zero rows, read
//!   at `q + off(u)` is `dy[q - off(t)]` for the flipped tap `u = k - 1 - t`, so
//!   `dpadded += view(u1, u2) · flipped(u1, u2)`, the kernel flipped and transposed;
//! - kernel: `dkernel(t1, t2) = view(t1, t2)ᵀ · dy`, summed over the grid.
//!
//! The grid holds positions the output does not (the last `k - 1` of each dimension),
//! computed and dropped: `grid rows / output positions` more work, which is why
//! `convolution` takes this path only for shapes where that is small.
//!
//! Rows are cut into chunks, each chunk's products run on one thread. An output element
//! of the forward pass or the input gradient is computed within one chunk, so those
//! chunks come in a multiple of the thread count (each thread takes as many); the kernel
//! gradient sums its chunks' partial sums in chunk order, so its chunks are fixed (a
//! multiple of 4, not of the threads), and the result has the same bits for any thread
//! count.

use mirra_device::{vectorize, Buffer, Device, Element};

#[cfg(target_arch = "x86_64")]
use super::shifted_operands::{NativeProducts, Products, Reduction};
use crate::threads::for_each_split;
use crate::{Result, Window, MAX_SPATIAL};

/// The element types of the gemm path: those gemm multiplies whose arithmetic is their
/// own (f32, f64). bf16 runs on the CPU's own kernels only ([`Grid::run_bf16`]).
pub(super) trait Float: Element + std::ops::Add<Output = Self> {}
impl Float for f32 {}
impl Float for f64 {}

/// Output elements per chunk of grid rows: a chunk's output (and its rows of the input)
/// stays in the core's cache while its `k1 · k2` products add into it.
const CHUNK_ELEMS: usize = 1 << 16;

/// The kernel gradient's chunks of runs come in multiples of this many.
const KERNEL_GRAD_CHUNKS: usize = 4;

/// Runs of positions (their grid starts and first rows) and the output rows they fill.
#[cfg(target_arch = "x86_64")]
type RunsInto<'a, E> = (&'a [(usize, usize)], &'a mut [E]);

/// What [`Grid::run`] computes, and from what.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pass {
    /// The output, from the padded input ([`Grid::padded_input`]) and the kernel.
    Forward,
    /// The input gradient, from the output gradient and the kernel.
    InputGrad,
    /// The kernel gradient, from the padded input and the output gradient.
    KernelGrad,
}

/// The geometry of a window of dilation 1 on the grid, every dimension three deep
/// (leading ones for 1D and 2D, as [`Window`] stores them). Output position `o` sits at
/// grid position `o · stride`; gemm's path (the whole grid as rows) and the input
/// gradient take stride 1 only, the CPU's own kernels any stride.
#[derive(Clone, Copy, Debug)]
pub(super) struct Grid {
    n: usize,
    c: usize,
    f: usize,
    input: [usize; MAX_SPATIAL],
    output: [usize; MAX_SPATIAL],
    kernel: [usize; MAX_SPATIAL],
    pad: [usize; MAX_SPATIAL],
    stride: [usize; MAX_SPATIAL],
    /// The padded input's size, which the output shares as its grid.
    dims: [usize; MAX_SPATIAL],
}

/// `s` after leading `fill`s, three dimensions deep.
fn deep(s: &[usize], fill: usize) -> [usize; MAX_SPATIAL] {
    let mut d = [fill; MAX_SPATIAL];
    d[MAX_SPATIAL - s.len()..].copy_from_slice(s);
    d
}

impl Grid {
    /// The grid of `window` over `n` images of `c` channels to `f` filters; `None` unless
    /// every dilation is 1.
    pub(super) fn new(window: &Window, n: usize, c: usize, f: usize) -> Option<Grid> {
        if window.dilation().iter().any(|&d| d != 1) {
            return None;
        }
        let (output, kernel) = (deep(window.output(), 1), deep(window.kernel(), 1));
        let (input, pad, stride) = (
            deep(window.input(), 1),
            deep(window.pad(), 0),
            deep(window.stride(), 1),
        );
        // The last window's span, or the whole input where `valid` windows leave some of
        // it unread.
        let dims = std::array::from_fn(|d| {
            ((output[d] - 1) * stride[d] + kernel[d]).max(input[d] + pad[d])
        });
        Some(Grid {
            n,
            c,
            f,
            input,
            output,
            kernel,
            pad,
            stride,
            dims,
        })
    }

    /// Whether every stride is 1.
    pub(super) fn unit_stride(&self) -> bool {
        self.stride == [1; MAX_SPATIAL]
    }

    /// Grid positions per image.
    fn image(&self) -> usize {
        self.dims.iter().product()
    }

    /// Grid rows of the whole batch.
    fn rows(&self) -> usize {
        self.n * self.image()
    }

    /// Whether `pass` on operands of `dtype` runs on this CPU's own kernels, which compute
    /// the kept positions only (gemm computes every grid row) and take any stride for the
    /// forward pass and the kernel gradient.
    pub(super) fn runs_native(&self, dtype: mirra_device::DType, pass: Pass) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let width = self.native_width(pass);
            match dtype {
                mirra_device::DType::F32 => {
                    super::shifted_avx512::available() && super::shifted_avx512::takes(width)
                }
                // Where bf16 products run on 16-bit units at all (not `MIRRA_BF16_MATMUL=f32`).
                mirra_device::DType::BF16 => {
                    super::shifted_avx512_bf16::available()
                        && super::bf16_gemm::native().is_some()
                        && super::shifted_avx512_bf16::takes(width)
                }
                _ => false,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (dtype, pass);
            false
        }
    }

    /// The width of what `pass` writes row by row: the filters of the output and of the
    /// kernel gradient's rows, the channels of the input gradient.
    fn native_width(&self, pass: Pass) -> usize {
        match pass {
            Pass::Forward | Pass::KernelGrad => self.f,
            Pass::InputGrad => self.c,
        }
    }

    /// Grid rows gemm computes per output position kept: the extra work of that path.
    pub(super) fn overhead(&self) -> f64 {
        self.image() as f64 / self.output.iter().product::<usize>().max(1) as f64
    }

    /// The grid offset of tap `(t1, t2, 0)`.
    fn offset(&self, t1: usize, t2: usize) -> usize {
        (t1 * self.dims[1] + t2) * self.dims[2]
    }

    /// The offset of the last tap: how far past a row the forward pass reads.
    fn reach(&self) -> usize {
        let k = self.kernel;
        self.offset(k[0] - 1, k[1] - 1) + k[2] - 1
    }

    /// The `(t1, t2)` tap pairs in kernel order, with their grid offsets.
    fn tap_pairs(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.kernel[0] * self.kernel[1])
            .map(|i| (i, self.offset(i / self.kernel[1], i % self.kernel[1])))
    }

    /// The runs of `size`'s last dimension when position `i` of `size` sits at `i · step
    /// + at` of an image of the grid: for each, the grid position where it starts in the
    /// image and its first position in `size`, in order (`size1 · size2` runs of `size3`
    /// positions, `step3` apart on the grid).
    fn image_runs(
        &self,
        size: [usize; 3],
        at: [usize; 3],
        step: [usize; 3],
    ) -> Vec<(usize, usize)> {
        (0..size[0] * size[1])
            .map(|r| {
                let (i1, i2) = (r / size[1], r % size[1]);
                let start = ((i1 * step[0] + at[0]) * self.dims[1] + i2 * step[1] + at[1])
                    * self.dims[2]
                    + at[2];
                (start, r * size[2])
            })
            .collect()
    }

    /// `src`, `n` blocks of `size` positions of `ch` elements, written into `grid` (whole
    /// images of the grid, `ch` elements a position) at offset `at` of each image, zeros
    /// around.
    fn scatter<T: Element>(
        &self,
        src: &[T],
        size: [usize; 3],
        at: [usize; 3],
        ch: usize,
        grid: &mut [T],
    ) {
        let (runs, run) = (self.image_runs(size, at, [1; 3]), size[2] * ch);
        let block = size.iter().product::<usize>() * ch;
        let work = grid.len();
        let images: Vec<(usize, &mut [T])> = grid
            .chunks_mut((self.image() * ch).max(1))
            .enumerate()
            .collect();
        for_each_split(images, work, &|(b, image): (usize, &mut [T])| {
            let src = &src[b * block..(b + 1) * block];
            // Each element written once: the zeros before each run (runs go in grid
            // order), the run, and the zeros after the last.
            let mut end = 0;
            for &(start, first) in &runs {
                image[end..start * ch].fill(T::default());
                end = start * ch + run;
                image[start * ch..end].copy_from_slice(&src[first * ch..first * ch + run]);
            }
            image[end..].fill(T::default());
        });
    }

    /// The inverse of [`scatter`](Grid::scatter): the `size` positions at `at` of each
    /// image of `grid` into `dst`.
    fn gather<T: Element>(
        &self,
        grid: &[T],
        size: [usize; 3],
        at: [usize; 3],
        ch: usize,
        dst: &mut [T],
    ) {
        let (runs, run) = (self.image_runs(size, at, [1; 3]), size[2] * ch);
        let image = self.image() * ch;
        let work = dst.len();
        let blocks: Vec<(usize, &mut [T])> = dst
            .chunks_mut((size.iter().product::<usize>() * ch).max(1))
            .enumerate()
            .collect();
        for_each_split(blocks, work, &|(b, block): (usize, &mut [T])| {
            let grid = &grid[b * image..(b + 1) * image];
            for &(start, first) in &runs {
                block[first * ch..first * ch + run]
                    .copy_from_slice(&grid[start * ch..start * ch + run]);
            }
        });
    }

    /// The input `x` (`[n, d1, d2, d3, c]`, contiguous) on the grid, with `reach` zero rows
    /// after it (what the last rows' taps read).
    pub(super) fn padded_input<T: Element>(&self, x: &[T]) -> Result<Buffer> {
        let body = self.rows() * self.c;
        let mut buf = Buffer::alloc(T::DTYPE, body + self.reach() * self.c, Device::Cpu)?;
        let padded = buf.as_mut_slice::<T>()?;
        padded[body..].fill(T::default());
        self.scatter(x, self.input, self.pad, self.c, &mut padded[..body]);
        Ok(buf)
    }

    /// The output gradient `dy` (`[n, o1, o2, o3, f]`) on the grid after `reach` zero rows,
    /// zeros where the grid has no output.
    fn padded_grad<T: Element>(&self, dy: &[T]) -> Result<Buffer> {
        let lead = self.reach() * self.f;
        let mut buf = Buffer::alloc(T::DTYPE, lead + self.rows() * self.f, Device::Cpu)?;
        let grid = buf.as_mut_slice::<T>()?;
        grid[..lead].fill(T::default());
        self.scatter(dy, self.output, [0; 3], self.f, &mut grid[lead..]);
        Ok(buf)
    }

    /// Grid rows per chunk when rows are `width` elements wide.
    fn chunk_rows(width: usize) -> usize {
        (CHUNK_ELEMS / width.max(1)).max(16)
    }

    /// `Σ over (t1, t2)` of `src` rows `g + offset(t1, t2)` (row stride `src_ch`, `k3 ·
    /// src_ch` wide) times `weights` block `(t1, t2)` (`[k3 · src_ch, dst_ch]`), for
    /// every grid row `g`, into `dst` (`rows x dst_ch`): what both the forward pass and
    /// the input gradient compute, through gemm.
    fn shifted_products<T: Float>(
        &self,
        src: &[T],
        src_ch: usize,
        weights: &[T],
        dst: &mut [T],
        dst_ch: usize,
    ) {
        let k = self.kernel[2] * src_ch;
        let rows = Grid::chunk_rows(dst_ch.max(src_ch));
        let chunks: Vec<(usize, &mut [T])> = dst.chunks_mut(rows * dst_ch).enumerate().collect();
        let work = self.rows() * k * dst_ch * self.kernel[0] * self.kernel[1];
        for_each_split(chunks, work, &|(i, out): (usize, &mut [T])| {
            mirra_device::denormals::ensure_this_thread();
            let (first, m) = (i * rows, out.len() / dst_ch);
            for (pair, offset) in self.tap_pairs() {
                let at = (first + offset) * src_ch;
                let (lhs, rhs) = (
                    &src[at..at + (m - 1) * src_ch + k],
                    &weights[pair * k * dst_ch..(pair + 1) * k * dst_ch],
                );
                product(
                    m,
                    dst_ch,
                    k,
                    out,
                    pair > 0,
                    (lhs, src_ch, 1),
                    (rhs, dst_ch, 1),
                );
            }
        });
    }

    /// [`image_runs`](Grid::image_runs) of every image, as rows of the whole batch.
    fn run_starts(
        &self,
        size: [usize; 3],
        at: [usize; 3],
        step: [usize; 3],
    ) -> Vec<(usize, usize)> {
        let runs = self.image_runs(size, at, step);
        let block = size.iter().product::<usize>();
        (0..self.n)
            .flat_map(|b| {
                runs.iter()
                    .map(move |&(start, first)| (b * self.image() + start, b * block + first))
            })
            .collect()
    }

    /// The runs of a chunk: enough to keep a chunk's rows `width` wide in cache.
    fn runs_per_chunk(&self, len: usize, width: usize) -> usize {
        (CHUNK_ELEMS / (len * width).max(1)).max(1)
    }

    /// The tap pairs' grid offsets, in kernel order.
    fn offsets(&self) -> Vec<usize> {
        self.tap_pairs().map(|(_, offset)| offset).collect()
    }

    /// [`shifted_products`](Grid::shifted_products) on this CPU's own kernels, for the
    /// positions of `size` at `i · step + at` only (no grid positions outside them): `dst`
    /// is `[n, size.., dst_ch]`, filled run by run by `rows(grid start, run's rows)` (runs
    /// that continue one another as one), each output element costing `inner`
    /// multiply-adds per tap pair.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn native_products<E: Send>(
        &self,
        src_ch: usize,
        inner: usize,
        dst: &mut [E],
        dst_ch: usize,
        size: [usize; 3],
        (at, step): ([usize; 3], [usize; 3]),
        rows: impl Fn(usize, &mut [E]) + Sync,
    ) {
        let len = size[2];
        let runs = self.run_starts(size, at, step);
        // Chunks in a multiple of the kernel threads, so that each takes as many (7 of a
        // size for 2 threads would keep one waiting an eighth of the time): each output
        // element is computed within one chunk, so the cut changes no bit.
        let per = even_chunks(
            runs.len(),
            self.runs_per_chunk(len, dst_ch.max(src_ch)),
            crate::num_threads(),
        );
        let work = dst.len() * inner * self.kernel[0] * self.kernel[1];
        let chunks: Vec<RunsInto<'_, E>> = runs
            .chunks(per)
            .zip(dst.chunks_mut(per * len * dst_ch))
            .collect();
        // A run's grid span: the next run continues it when it starts there.
        let span = len * step[2];
        for_each_split(chunks, work, &|(runs, mut out): RunsInto<'_, E>| {
            mirra_device::denormals::ensure_this_thread();
            // Runs that continue one another on the grid (a valid convolution's input
            // gradient: an image's rows back to back, and the next image's after them)
            // go to `rows` as one, so its row blocks are as tall as its kernels take
            // rather than cut at each image row (13 rows: blocks of 4, 4, 4 and 1 where
            // the kernel holds 14). Every output element is summed in one order whatever
            // block it falls in, so the bits are the same.
            let mut first = 0;
            while first < runs.len() {
                let mut end = first + 1;
                while end < runs.len() && runs[end].0 == runs[end - 1].0 + span {
                    end += 1;
                }
                let (joined, rest) = out.split_at_mut((end - first) * len * dst_ch);
                rows(runs[first].0, joined);
                out = rest;
                first = end;
            }
        });
    }

    /// [`native_products`](Grid::native_products) on the kernels of `E` (f32, or bf16
    /// as its bits): `src` (`src_ch` a position) times `weights` (`[k1 · k2][k3 ·
    /// src_ch][dst_ch]`).
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn native_products_of<E: NativeProducts + Send + Sync>(
        &self,
        src: &[E],
        src_ch: usize,
        weights: &[E],
        dst: &mut [E],
        dst_ch: usize,
        size: [usize; 3],
        (at, step): ([usize; 3], [usize; 3]),
    ) where
        E::Weight: Sync,
    {
        let offsets = self.offsets();
        let inner = self.kernel[2] * src_ch;
        let (weights, weight_rows) = E::lay_out(weights, offsets.len(), inner, dst_ch);
        let products = Products {
            src,
            channels: src_ch,
            step: step[2],
            inner,
            offsets: &offsets,
            weights: &weights,
            weight_rows,
            n: dst_ch,
        };
        self.native_products(src_ch, inner, dst, dst_ch, size, (at, step), |g, out| {
            E::rows(&products, g, out)
        });
    }

    /// The kernel gradient on the CPU's own kernels, into f32 `dk` (`[k.., c, f]`):
    /// runs of output positions in fixed chunks, each chunk's [`Reduction`] of every tap
    /// pair computed by `block(pair's grid offset, reduction, pair's block of dk)`, the
    /// chunks' partial sums added in order.
    #[cfg(target_arch = "x86_64")]
    fn native_kernel_grad<S: Sync, D: Sync>(
        &self,
        src: &[S],
        dy: &[D],
        dk: &mut [f32],
        block: impl Fn(usize, &Reduction<'_, S, D>, &mut [f32]) + Sync,
    ) -> Result<()> {
        let runs = self.run_starts(self.output, [0; 3], self.stride);
        let len = self.output[2];
        // The chunks are summed in order, so their cut must not depend on the thread
        // count: a multiple of 4 of them, which 1, 2 and 4 kernel threads share evenly.
        let per = even_chunks(
            runs.len(),
            self.runs_per_chunk(len, self.c.max(self.f)),
            KERNEL_GRAD_CHUNKS,
        );
        let size = self.kernel[2] * self.c * self.f;
        let work = self.n * self.output.iter().product::<usize>() * dk.len();
        self.sum_chunks(dk, runs.chunks(per).collect(), work, |runs, part| {
            for (pair, offset) in self.tap_pairs() {
                let reduction = Reduction {
                    src: &src[offset * self.c..],
                    channels: self.c,
                    step: self.stride[2],
                    inner: self.kernel[2] * self.c,
                    dy,
                    n: self.f,
                    runs,
                    len,
                };
                block(
                    offset,
                    &reduction,
                    &mut part[pair * size..(pair + 1) * size],
                );
            }
        })
    }

    /// `pass` from its two operands into `out` (shapes as the passes below say).
    pub(super) fn run<T: Float>(&self, pass: Pass, a: &[T], b: &[T], out: &mut [T]) -> Result<()> {
        match pass {
            Pass::Forward => self.forward(a, b, out),
            Pass::InputGrad => self.input_grad(a, b, out),
            Pass::KernelGrad => self.kernel_grad(a, b, out),
        }
    }

    /// `pass` on bf16 operands (their bits) into `out`, on `vdpbf16ps`: the shapes of
    /// [`run`](Grid::run), sums in f32, each output rounded once. Only where
    /// [`runs_native`](Grid::runs_native) says bf16 runs natively (gemm has no bf16).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn run_bf16(&self, pass: Pass, a: &[u16], b: &[u16], out: &mut [u16]) -> Result<()> {
        assert!(
            self.runs_native(mirra_device::DType::BF16, pass),
            "bf16 shifted products run on AVX-512 BF16 only"
        );
        match pass {
            Pass::Forward => self.native_products_of(
                a,
                self.c,
                b,
                out,
                self.f,
                self.output,
                ([0; 3], self.stride),
            ),
            Pass::InputGrad => {
                let grad = self.padded_grad(bytemuck::cast_slice::<u16, half::bf16>(a))?;
                let src: &[u16] = bytemuck::cast_slice(grad.as_slice::<half::bf16>()?);
                let flipped = self.flipped(b);
                self.native_products_of(
                    src,
                    self.f,
                    &flipped,
                    out,
                    self.c,
                    self.input,
                    (self.pad, [1; 3]),
                );
            }
            Pass::KernelGrad => {
                use super::shifted_avx512_bf16::{
                    pack_runs_into, pack_steps_into, packed_runs_len,
                };
                let (src, len) = (a, self.output[2]);
                // The packings in pooled buffers (as large as the operands: fresh memory
                // each step would fault its pages in again).
                let mut dy = pooled_words(packed_runs_len(b.len(), len, self.f))?;
                let dy = {
                    let dy = bytemuck::cast_slice_mut(dy.as_mut_slice::<i32>()?);
                    pack_runs_into(b, len, self.f, dy);
                    &*dy
                };
                let mut paired = pooled_words(src.len())?;
                let paired = {
                    let paired = bytemuck::cast_slice_mut(paired.as_mut_slice::<i32>()?);
                    pack_steps_into(src, self.stride[2] * self.c, paired);
                    &*paired
                };
                let mut sums = vec![0f32; out.len()];
                self.native_kernel_grad(src, dy, &mut sums, |offset, reduction, block| {
                    reduction.block(&paired[offset * self.c..], block)
                })?;
                for (o, s) in out.iter_mut().zip(&sums) {
                    *o = half::bf16::from_f32(*s).to_bits();
                }
            }
        }
        Ok(())
    }

    /// The forward pass: `x` (`[n, d.., c]`) with `kernel` (`[k.., c, f]`) into `y`
    /// (`[n, o.., f]`).
    fn forward<T: Float>(&self, padded: &[T], kernel: &[T], y: &mut [T]) -> Result<()> {
        let src = padded;
        #[cfg(target_arch = "x86_64")]
        if let Some((src, kernel, y)) = native(src, kernel, y, self.native_width(Pass::Forward)) {
            self.native_products_of(
                src,
                self.c,
                kernel,
                y,
                self.f,
                self.output,
                ([0; 3], self.stride),
            );
            return Ok(());
        }
        assert!(self.unit_stride(), "gemm's shifted products take stride 1");
        let mut out = Buffer::alloc(T::DTYPE, self.rows() * self.f, Device::Cpu)?;
        let grid = out.as_mut_slice::<T>()?;
        self.shifted_products(src, self.c, kernel, grid, self.f);
        self.gather(grid, self.output, [0; 3], self.f, y);
        Ok(())
    }

    /// `kernel` (`[k.., c, f]`) as the input gradient's weights: `flipped[u][f][c] =
    /// kernel[taps - 1 - u][c][f]`, tap order reversed in every dimension at once, each
    /// tap's matrix transposed.
    fn flipped<T: Copy + Default>(&self, kernel: &[T]) -> Vec<T> {
        let (c, f) = (self.c, self.f);
        let taps = self.kernel.iter().product::<usize>();
        let mut flipped = vec![T::default(); taps * c * f];
        for (u, block) in flipped.chunks_exact_mut((c * f).max(1)).enumerate() {
            let t = &kernel[(taps - 1 - u) * c * f..(taps - u) * c * f];
            for (fi, row) in block.chunks_exact_mut(c.max(1)).enumerate() {
                for (ci, v) in row.iter_mut().enumerate() {
                    *v = t[ci * f + fi];
                }
            }
        }
        flipped
    }

    /// The input gradient: `dy` (`[n, o.., f]`) through `kernel` (`[k.., c, f]`) into
    /// `dx` (`[n, d.., c]`).
    fn input_grad<T: Float>(&self, dy: &[T], kernel: &[T], dx: &mut [T]) -> Result<()> {
        assert!(
            self.unit_stride(),
            "the shifted input gradient takes stride 1"
        );
        let (c, f) = (self.c, self.f);
        let flipped = self.flipped(kernel);
        let grad = self.padded_grad(dy)?;
        let src = grad.as_slice::<T>()?;
        #[cfg(target_arch = "x86_64")]
        if let Some((src, flipped, dx)) =
            native(src, &flipped, dx, self.native_width(Pass::InputGrad))
        {
            self.native_products_of(src, f, flipped, dx, c, self.input, (self.pad, [1; 3]));
            return Ok(());
        }
        let mut out = Buffer::alloc(T::DTYPE, self.rows() * c, Device::Cpu)?;
        let grid = out.as_mut_slice::<T>()?;
        self.shifted_products(src, f, &flipped, grid, c);
        self.gather(grid, self.input, self.pad, c, dx);
        Ok(())
    }

    /// The kernel gradient: `Σ` over positions of `x`'s taps times `dy`, into `dk`
    /// (`[k.., c, f]`).
    fn kernel_grad<T: Float>(&self, padded: &[T], dy: &[T], dk: &mut [T]) -> Result<()> {
        let src = padded;
        let block = self.kernel[2] * self.c * self.f;
        #[cfg(target_arch = "x86_64")]
        if let Some((src, dy, dk)) = native(src, dy, dk, self.native_width(Pass::KernelGrad)) {
            return self
                .native_kernel_grad(src, dy, dk, |_, reduction, block| reduction.block(block));
        }
        assert!(self.unit_stride(), "gemm's shifted products take stride 1");
        let grad = self.padded_grad(dy)?;
        let grad = &grad.as_slice::<T>()?[self.reach() * self.f..];
        let (c, f, k) = (self.c, self.f, self.kernel[2] * self.c);
        let rows = Grid::chunk_rows(c.max(f));
        let firsts: Vec<usize> = (0..self.rows()).step_by(rows).collect();
        self.sum_chunks(dk, firsts, self.rows() * dk.len(), |first, part| {
            let m = rows.min(self.rows() - first);
            let dy = &grad[first * f..(first + m) * f];
            for (pair, offset) in self.tap_pairs() {
                let at = (first + offset) * c;
                let lhs = &src[at..at + (m - 1) * c + k];
                product(
                    k,
                    f,
                    m,
                    &mut part[pair * block..(pair + 1) * block],
                    false,
                    (lhs, 1, c),
                    (dy, f, 1),
                );
            }
        })
    }

    /// `dk` = the sum, in chunk order, of `part(chunk, partial)` over `chunks`, each
    /// partial sum computed on its own (by whichever thread) into zeros.
    fn sum_chunks<T: Float, C: Send>(
        &self,
        dk: &mut [T],
        chunks: Vec<C>,
        work: usize,
        part: impl Fn(C, &mut [T]) + Sync,
    ) -> Result<()> {
        // Pooled: a kernel gradient's partial sums are megabytes, which fresh memory
        // would fault in again every step; each chunk's zeroed by its thread.
        let mut partial = Buffer::alloc(T::DTYPE, chunks.len() * dk.len(), Device::Cpu)?;
        let partial = partial.as_mut_slice::<T>()?;
        let items: Vec<(C, &mut [T])> = chunks
            .into_iter()
            .zip(partial.chunks_mut(dk.len().max(1)))
            .collect();
        for_each_split(items, work, &|(chunk, into): (C, &mut [T])| {
            mirra_device::denormals::ensure_this_thread();
            into.fill(T::default());
            part(chunk, into);
        });
        dk.fill(T::default());
        for part in partial.chunks_exact(dk.len().max(1)) {
            vectorize(
                #[inline(always)]
                || {
                    for (d, &p) in dk.iter_mut().zip(part) {
                        *d = *d + p;
                    }
                },
            );
        }
        Ok(())
    }
}

/// Items per chunk when `items` are cut into chunks of at most `most`: as many chunks as
/// the next multiple of `parts` (fewer only where there are fewer items), as even as
/// whole items allow.
fn even_chunks(items: usize, most: usize, parts: usize) -> usize {
    let chunks = items
        .div_ceil(most.max(1))
        .max(1)
        .next_multiple_of(parts.max(1));
    items.div_ceil(chunks).max(1)
}

/// A pooled host buffer of `len` 32-bit words (as `I32`; the bf16 kernels' packed pairs
/// are `u32`s).
#[cfg(target_arch = "x86_64")]
fn pooled_words(len: usize) -> Result<Buffer> {
    Ok(Buffer::alloc(mirra_device::DType::I32, len, Device::Cpu)?)
}

/// The operands as f32 for this CPU's own kernels, when `T` is f32 and the CPU has them
/// for rows `width` wide; `None` otherwise.
#[cfg(target_arch = "x86_64")]
fn native<'a, T: Element>(
    a: &'a [T],
    b: &'a [T],
    out: &'a mut [T],
    width: usize,
) -> Option<(&'a [f32], &'a [f32], &'a mut [f32])> {
    use super::shifted_avx512::{available, takes};
    if !(available() && takes(width)) {
        return None;
    }
    Some((as_f32(a)?, as_f32(b)?, as_f32_mut(out)?))
}

/// `s` as f32s when `T` is f32.
fn as_f32<T: Element>(s: &[T]) -> Option<&[f32]> {
    (T::DTYPE == mirra_device::DType::F32).then(|| bytemuck::cast_slice(s))
}

/// `s` as f32s when `T` is f32.
fn as_f32_mut<T: Element>(s: &mut [T]) -> Option<&mut [f32]> {
    (T::DTYPE == mirra_device::DType::F32).then(|| bytemuck::cast_slice_mut(s))
}

/// `dst = [dst +] lhs · rhs` on this thread, `m x k` by `k x n` into `m x n` (row stride
/// `n`); each operand with its (row, column) strides, its slice covering every element it
/// reads.
fn product<T: Float>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    accumulate: bool,
    (lhs, lhs_rs, lhs_cs): (&[T], usize, usize),
    (rhs, rhs_rs, rhs_cs): (&[T], usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rs: usize, cs: usize, r: usize, c: usize| (r - 1) * rs + (c - 1) * cs;
    assert!(
        dst.len() >= m * n
            && (k == 0
                || (lhs.len() > last(lhs_rs, lhs_cs, m, k)
                    && rhs.len() > last(rhs_rs, rhs_cs, k, n))),
        "a product's operands do not cover its shape"
    );
    // SAFETY: the assertion above: every element the (m, k) x (k, n) product reads with
    // these strides lies inside its slice, and dst holds the m x n result with strides
    // (n, 1). T is f32 or f64, which gemm supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::from_f64(1.0),
            T::from_f64(1.0),
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::even_chunks;

    /// Chunks no larger than asked, as many as a multiple of the parts, every item in one.
    #[test]
    fn even_chunks_come_in_a_multiple_of_the_parts() {
        for (items, most, parts) in [(896, 146, 2), (896, 146, 4), (7, 100, 4), (1664, 78, 3)] {
            let per = even_chunks(items, most, parts);
            let chunks = items.div_ceil(per);
            assert!(per <= most, "{items} {most} {parts}: {per}");
            assert_eq!(chunks % parts, 0, "{items} {most} {parts}: {chunks} chunks");
        }
        // 7 chunks of 146 (the 7x7 layer's runs at batch 128) become 8 of 112.
        assert_eq!(even_chunks(896, 146, 2), 112);
        // Nothing to cut, or less than one part each: one item a chunk, never zero.
        assert_eq!(even_chunks(0, 146, 2), 1);
        assert_eq!(even_chunks(3, 0, 1), 1);
        assert_eq!(even_chunks(9, 1, 4), 1);
    }
}
