// sgemm rates through BLIS's typed API (bli_sgemm), row-major, at nlptrain's shapes:
// fwd out[M,N] = x[M,K] W[N,K]^T, dX[M,K] = dY[M,N] W[N,K], dW[N,K] = dY^T[N,M] X[M,K]
#include <blis.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
// row-major C[M,N] = beta C + op(A) op(B); A stored [M,K] or [K,M] (ta)
static void rm_sgemm(int ta,int tb,int M,int N,int K,const float*A,int lda,const float*B,int ldb,float beta,float*C,int ldc){
  float alpha=1.f;
  // row-major via BLIS general strides: element (i,j) of A at A[i*rs + j*cs]
  bli_sgemm(ta?BLIS_TRANSPOSE:BLIS_NO_TRANSPOSE, tb?BLIS_TRANSPOSE:BLIS_NO_TRANSPOSE, M,N,K,&alpha,
            (float*)A, lda, 1, (float*)B, ldb, 1, &beta, C, ldc, 1);
}
typedef struct {const char*n;int M,K,N;} S;
int main(int argc,char**argv){
  int th = argc>1?atoi(argv[1]):2;
  bli_thread_set_num_threads(th);
  S sh[]={{"4x256 qkv",704,256,768},{"4x256 fc1",704,256,1024},{"4x256 fc2",704,1024,256},{"4x256 fc1 T128",4096,256,1024},{"base qkv",4096,768,2304},{"base fc1",4096,768,3072},{"base fc2",4096,3072,768},{"base1024 qkv",1024,768,2304},{"base1024 proj",1024,768,768},{"base1024 fc1",1024,768,3072},{"base1024 fc2",1024,3072,768}};
  printf("BLIS %s, arch %s, threads %d\n", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()), th);
  for(unsigned s=0;s<sizeof sh/sizeof*sh;s++){
    int M=sh[s].M,K=sh[s].K,N=sh[s].N;
    float*X=malloc(sizeof(float)*M*K),*W=malloc(sizeof(float)*N*K),*Y=malloc(sizeof(float)*M*N),*dX=malloc(sizeof(float)*M*K),*dW=malloc(sizeof(float)*N*K);
    for(long i=0;i<(long)M*K;i++)X[i]=0.01f*(i%97);for(long i=0;i<(long)N*K;i++)W[i]=0.02f*(i%89);for(long i=0;i<(long)M*N;i++)Y[i]=0.03f*(i%83);
    double fl=2.0*M*N*K, r[3];
    for(int v=0;v<3;v++){
      double best=1e9;
      for(int rep=0;rep<3;rep++){
        int n=0; double t0=now();
        while(now()-t0<0.3||n<3){
          if(v==0) rm_sgemm(0,1,M,N,K,X,K,W,K,0.f,Y,N);          // x W^T
          else if(v==1) rm_sgemm(1,0,N,K,M,Y,N,X,K,1.f,dW,K);     // dY^T X
          else rm_sgemm(0,0,M,K,N,Y,N,W,K,1.f,dX,K);              // dY W
          n++;}
        double t=(now()-t0)/n; if(t<best)best=t;}
      r[v]=fl/best/1e9;}
    printf("%-15s M=%d K=%d N=%d  fwd %.0f  dW %.0f  dX %.0f GFLOP/s\n",sh[s].n,M,K,N,r[0],r[1],r[2]);
    free(X);free(W);free(Y);free(dX);free(dW);
  }
}
