set terminal pngcairo size 1000,600
set output "/work/main/examples/cnn/protocol-runs/accuracy_vs_time.png"
set title "LeNet-5 on Fashion-MNIST, 9 heterogeneous workers (K = 5), median over seeds 1,2,3,4,5"
set xlabel "wall-clock seconds"
set ylabel "test accuracy (10,000 images)"
set key bottom right
set grid
set yrange [0.5:0.95]
set arrow from graph 0, first 0.88 to graph 1, first 0.88 nohead dt 2
plot "/work/main/examples/cnn/protocol-runs/curve_ddp_median.dat" using 1:2 with lines lw 2 lc rgb "#9400d3" title "DDP", "/work/main/examples/cnn/protocol-runs/curve_ddp_fp16_median.dat" using 1:2 with lines lw 2 lc rgb "#009e73" title "DDP + fp16 hook", "/work/main/examples/cnn/protocol-runs/curve_ddp_powersgd_median.dat" using 1:2 with lines lw 2 lc rgb "#56b4e9" title "DDP + PowerSGD", "/work/main/examples/cnn/protocol-runs/curve_ddp_localsgd_median.dat" using 1:2 with lines lw 2 lc rgb "#e69f00" title "DDP post-local SGD", "/work/main/examples/cnn/protocol-runs/curve_ddp_propbatch_median.dat" using 1:2 with lines lw 2 lc rgb "#cc79a7" title "DDP, speed-proportional batches", "/work/main/examples/cnn/protocol-runs/curve_bsp_median.dat" using 1:2 with lines lw 2 lc rgb "#0072b2" title "BSP", "/work/main/examples/cnn/protocol-runs/curve_adsp_median.dat" using 1:2 with lines lw 2 lc rgb "#e51e10" title "ADSP", "/work/main/examples/cnn/protocol-runs/curve_ashl_median.dat" using 1:2 with lines lw 2 lc rgb "#000000" title "ASHL", "/work/main/examples/cnn/protocol-runs/curve_ashl_plus_median.dat" using 1:2 with lines lw 2 lc rgb "#a0522d" title "ASHL+"
