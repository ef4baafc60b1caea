"""Eight float32 lanes at once in numba: the vector type of the packet traversal.

numba has no SIMD type; _Vec8 is one, an LLVM <8 x float> held in a
register, and the intrinsics below compile each operation to one AVX
instruction (vsubps, vmulps, vcmpps, ...), rounded as the scalar operation
is (no fast-math flags: nothing is contracted into an FMA). Comparisons
give the lanes' results as the bits of an int (bit l: lane l); the
interval updates of a traversal step (_vnear_tf, _vfar_tn) keep theirs as
vector masks.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

LANES = 8
_I32 = ir.IntType(32)
_VEC = ir.VectorType(ir.FloatType(), LANES)


class _Vec8(types.Type):
    def __init__(self):
        super().__init__(name="float32x8")


_vec8 = _Vec8()


@register_model(_Vec8)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _mask(builder, bits):
    # the low 8 bits of an int64 as <8 x i1>: the int in every lane, ANDed with
    # lane l's bit, compared with 0 (a vpbroadcastd, vpand and vpcmpeqd; a
    # bitcast of i8 to <8 x i1> compiled to a byte insert per lane: 1M rays,
    # 2 cores, 1.01-1.03x on the bunny and conference, camera and diffuse)
    vi = ir.VectorType(_I32, LANES)
    b32 = builder.trunc(bits, _I32)
    splat = builder.insert_element(ir.Constant(vi, ir.Undefined), b32, ir.Constant(_I32, 0))
    splat = builder.shuffle_vector(splat, ir.Constant(vi, ir.Undefined),
                                   ir.Constant(vi, [0] * LANES))
    lane_bits = ir.Constant(vi, [1 << k for k in range(LANES)])
    return builder.icmp_unsigned("!=", builder.and_(splat, lane_bits),
                                 ir.Constant(vi, [0] * LANES))


def _arith(op):
    @intrinsic
    def arith(typingctx, a, b):
        if a != _vec8 or b != _vec8:
            return None

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], args[1])
        return _vec8(_vec8, _vec8), codegen
    return arith


def _compare(op, ordered=True):
    @intrinsic
    def compare(typingctx, a, b):
        if a != _vec8 or b != _vec8:
            return None

        def codegen(context, builder, signature, args):
            cmp = builder.fcmp_ordered if ordered else builder.fcmp_unordered
            bits = builder.bitcast(cmp(op, args[0], args[1]), ir.IntType(LANES))
            return builder.zext(bits, ir.IntType(64))
        return types.int64(_vec8, _vec8), codegen
    return compare


_vadd, _vsub, _vmul, _vdiv = (_arith(op) for op in ("fadd", "fsub", "fmul", "fdiv"))
_vlt, _vgt, _vle, _vge, _veq = (_compare(op) for op in ("<", ">", "<=", ">=", "=="))
_vne = _compare("!=", ordered=False)  # true for NaN, as Python's !=


@intrinsic
def _vsel(typingctx, bits, a, b):
    """Lane l: a[l] where bit l of bits is set, else b[l]."""
    if not isinstance(bits, types.Integer) or a != _vec8 or b != _vec8:
        return None

    def codegen(context, builder, signature, args):
        bits64 = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.select(_mask(builder, bits64), args[1], args[2])
    return _vec8(bits, _vec8, _vec8), codegen


@intrinsic
def _vedge64(typingctx, a1, b1, a2, b2):
    """float32(float64(a1) * b1 - float64(a2) * b2) per lane: exact products."""
    if any(x != _vec8 for x in (a1, b1, a2, b2)):
        return None

    def codegen(context, builder, signature, args):
        vd = ir.VectorType(ir.DoubleType(), LANES)
        x1, y1, x2, y2 = (builder.fpext(x, vd) for x in args)
        return builder.fptrunc(builder.fsub(builder.fmul(x1, y1), builder.fmul(x2, y2)), _VEC)
    return _vec8(_vec8, _vec8, _vec8, _vec8), codegen


@intrinsic
def _splat(typingctx, x):
    """Every lane x (a float32)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        one = builder.insert_element(ir.Constant(_VEC, ir.Undefined), args[0],
                                     ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))
    return _vec8(x), codegen


@intrinsic
def _lane(typingctx, a, k):
    """Lane k of a."""
    if a != _vec8 or not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        index = context.cast(builder, args[1], signature.args[1], types.int32)
        return builder.extract_element(args[0], index)
    return types.float32(_vec8, k), codegen


@intrinsic
def _vload(typingctx, arr, start):
    """Lanes arr[start:start + 8] of a contiguous float32 array."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [index]), _VEC.as_pointer())
        return builder.load(ptr, align=4)
    return _vec8(arr, start), codegen


@intrinsic
def _vstore(typingctx, arr, start, a):
    """arr[start:start + 8] = the lanes of a."""
    if not isinstance(arr, types.Array) or arr.dtype != types.float32 or a != _vec8:
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [index]), _VEC.as_pointer())
        builder.store(args[2], ptr, align=4)
        return context.get_dummy_value()
    return types.none(arr, start, _vec8), codegen


def _both_sides(builder, ts, tn, tf, eps):
    # lanes that visit both children of a node: their plane distance ts is
    # neither beyond tf + eps nor before tn - eps (a NaN ts is neither), as a
    # vector mask
    near_only = builder.fcmp_ordered(">", ts, builder.fadd(tf, eps))
    far_only = builder.fcmp_ordered("<", ts, builder.fsub(tn, eps))
    return builder.not_(builder.or_(near_only, far_only))


def _child_end(toward, end):
    # an intrinsic (ts, tn, tf, eps) -> a child's end: ts in the lanes that
    # visit both children where ts is `toward` (an ordered comparison) of the
    # node's end (argument `end`: 1 tn, 2 tf), that end in the others
    @intrinsic
    def child_end(typingctx, ts, tn, tf, eps):
        if any(x != _vec8 for x in (ts, tn, tf, eps)):
            return None

        def codegen(context, builder, signature, args):
            ts, tn, tf, eps = args
            past = builder.fcmp_ordered(toward, ts, args[end])
            take = builder.and_(_both_sides(builder, ts, tn, tf, eps), past)
            return builder.select(take, ts, args[end])
        return _vec8(_vec8, _vec8, _vec8, _vec8), codegen
    return child_end


# _vnear_tf(ts, tn, tf, eps): the near child's far end, fminf(ts, tf) in the
# lanes that visit both children, tf in the others (and where ts is NaN, as
# the GPU's fminf). _vfar_tn: the far child's near end, fmaxf(ts, tn) there,
# tn elsewhere. Both and the comparison stay vector masks, not an int's bits:
# the traversal's interval goes through _vnear_tf every step, and the way
# through the bits (compare, move to an int, broadcast, test) made each step
# wait longer (200k diffuse rays on the bunny, one core: the kernel 1.07x
# faster).
_vnear_tf = _child_end("<", 2)
_vfar_tn = _child_end(">", 1)


@intrinsic
def _prefetch(typingctx, arr, start):
    """Prefetch the cache line of arr[start] (a hint: no fault, no effect on results)."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(data, [index]), ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(arr, start), codegen
