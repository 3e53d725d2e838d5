// experiment: linear-layer backward dX = dY W and dW = dY^T X, sequential (2 threads each) vs
// concurrent (one thread each, in an omp parallel region of 2)
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <functional>
#include "backend/cpu/gemm.h"
extern "C" void openblas_set_num_threads(int);
using namespace nlp::cpu;
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(){
  GemmLib lib = auto_gemm_lib();
  printf("%s\n", gemm_lib_description(lib).c_str());
  struct S{const char*n;int M,K,N;} shapes[]={{"qkv",704,256,768},{"fc1",704,256,1024},{"fc2",704,1024,256},{"proj",704,256,256},{"fc1-base",1024,768,3072},{"fc2-base",1024,3072,768}};
  for (auto s: shapes){
    std::vector<float> X(size_t(s.M)*s.K,0.1f), W(size_t(s.N)*s.K,0.2f), dY(size_t(s.M)*s.N,0.3f), dX(size_t(s.M)*s.K), dW(size_t(s.N)*s.K);
    auto seq=[&]{ omp_set_num_threads(2); openblas_set_num_threads(2);
      gemm(lib,false,false,s.M,s.K,s.N,dY.data(),s.N,W.data(),s.K,0.f,dX.data(),s.K);
      gemm(lib,true,false,s.N,s.K,s.M,dY.data(),s.N,X.data(),s.K,1.f,dW.data(),s.K);};
    auto conc=[&]{
      #pragma omp parallel num_threads(2)
      { if(omp_get_thread_num()==0) gemm(lib,false,false,s.M,s.K,s.N,dY.data(),s.N,W.data(),s.K,0.f,dX.data(),s.K);
        else gemm(lib,true,false,s.N,s.K,s.M,dY.data(),s.N,X.data(),s.K,1.f,dW.data(),s.K);} };
    double flops=4.0*s.M*s.K*s.N;
    double best[2]={1e9,1e9};
    for(int r=0;r<5;r++){ for(int v=0;v<2;v++){ auto f = v?std::function<void()>(conc):std::function<void()>(seq); f(); f(); double t0=now(); int n=0; while(now()-t0<0.3||n<3){f();++n;} best[v]=std::min(best[v],(now()-t0)/n);} }
    printf("%-9s M=%d K=%d N=%d  seq %.3f ms (%.0f GF/s)  conc %.3f ms (%.0f GF/s)  conc/seq %.2f\n",s.n,s.M,s.K,s.N,best[0]*1e3,flops/best[0]/1e9,best[1]*1e3,flops/best[1]/1e9,best[1]/best[0]);
  }
}
