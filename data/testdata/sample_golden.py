"""Independent transcription of data/sample.go (SplitMix64 seeded with seed XOR FNV-1a-64(label),
Lemire bounded draw, partial Fisher-Yates, sorted). Prints the indexes pinned in TestSampleStable:
Sample(100 examples, k=5, seed 0, label "test/nq"). Run: python3 data/testdata/sample_golden.py"""
M=(1<<64)-1
def fnv64a(b):
    h=0xcbf29ce484222325
    for c in b: h=((h^c)*0x100000001b3)&M
    return h
class R:
    def __init__(s, seed, label):
        s.state=(seed&M)^fnv64a(label.encode()); s.next()
    def next(s):
        s.state=(s.state+0x9e3779b97f4a7c15)&M; z=s.state
        z=((z^(z>>30))*0xbf58476d1ce4e5b9)&M; z=((z^(z>>27))*0x94d049bb133111eb)&M
        return z^(z>>31)
    def intn(s,n):
        m=s.next()*n; hi,lo=m>>64,m&M
        if lo<n:
            th=((-n)&M)%n
            while lo<th:
                m=s.next()*n; hi,lo=m>>64,m&M
        return hi
def sample(n,k,r):
    p=list(range(n))
    for i in range(k):
        j=i+r.intn(n-i); p[i],p[j]=p[j],p[i]
    return sorted(p[:k])
print(sample(100,5,R(0,"test/nq")))
