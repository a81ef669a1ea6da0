"""Lane-level model of round 49's `rk` (patches/rk.patch): rank_group_log2
and ThreadKeys::emit_ranked of kernels/indexer_select.cu, every CTA of a row
ranking its share of the candidates with 1024 lanes, xor-shuffle sums within
groups of 2^g lanes. Checks on random pools (a third of them all one key)
that the slots K - need .. K - 1 get exactly the `need` largest candidates,
each once, and no other slot is written. Run: .venv/bin/python THIS_FILE
(numpy); it prints how many pools took the ranked path and how many fell
back to the last CTA's pick."""
import numpy as np
T=1024
def group_log2(ties, parts):
    per=(ties+parts-1)//parts
    if per>T: return None
    q=T//per; g_log2=min(5, q.bit_length()-1); g=1<<g_log2
    steps=(ties+g-1)//g*((per*g+T-1)//T)
    return g_log2 if steps<=64 else None
def emit_ranked(pool, need, base, first, stride, g_log2, out):
    count=len(pool); g=1<<g_log2; groups=T>>g_log2
    mine_count=(count-first+stride-1)//stride if count>first else 0
    k0=0
    while k0<mine_count:
        above=np.zeros(T,dtype=np.int64); mine=np.full(T,2**64-1,dtype=np.uint64); valid=np.zeros(T,bool)
        for t in range(T):
            k=k0+(t>>g_log2); valid[t]=k<mine_count
            if valid[t]: mine[t]=pool[first+k*stride]
            sub=t&(g-1)
            above[t]=int((pool[sub::g]>mine[t]).sum())
        # xor shuffle reduce within groups of g lanes (warp = 32)
        o=g>>1
        while o>0:
            above=above+above[np.arange(T)^o]; o>>=1
        for t in range(T):
            if valid[t] and (t&(g-1))==0 and above[t]<need:
                assert out[base+above[t]]==-1; out[base+above[t]]=pool[first+((k0+(t>>g_log2)))*stride]
        k0+=groups
rng=np.random.default_rng(1); checked=0; fallback=0
for trial in range(300):
    parts=int(rng.choice([4,8,16,32,64,128])); ties=int(rng.integers(1,4000)); K=int(rng.choice([512,1024,2048]))
    need=int(rng.integers(1,min(ties,K)+1))
    keys=rng.integers(0,2**21,size=ties)|(5<<21); pos=rng.permutation(200000)[:ties]
    if trial%3==0: keys[:]=keys[0]  # all equal keys
    pool=((keys.astype(np.uint64)<<np.uint64(32))|(~pos.astype(np.uint32)).astype(np.uint64))
    gl=group_log2(ties,parts)
    if gl is None: fallback+=1; continue
    out=np.full(K,-1,dtype=object); base=K-need
    for part in range(parts): emit_ranked(pool,need,base,part,parts,gl,out)
    got=sorted(int(x) for x in out[base:]); want=sorted(int(x) for x in np.sort(pool)[::-1][:need])
    assert got==want and all(o==-1 for o in out[:base]), (trial,ties,parts)
    checked+=1
print("checked",checked,"fallback",fallback)
