-- run: rep=0 config=stock tag=cost-stock-0 wall_s=7.164 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:20Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.342087', '0.000000', '615.570263', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:23Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.724705', '0.000000', '265.235915', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:25Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1286.716346', '0.000000', '119.707694', '161512', '832', '', '');
-- run: rep=0 config=cublas tag=cost-cublas-0 wall_s=7.964 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:28Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '276.145005', '0.000000', '266.032116', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:30Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '319.452824', '0.000000', '280.406728', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:33Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '516.269712', '0.000000', '298.351506', '161512', '2080', '', '');
-- run: rep=0 config=mmq tag=cost-mmq-0 wall_s=7.457 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:36Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.372936', '0.000000', '615.411186', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:38Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '339.594351', '0.000000', '263.775651', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:40Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1288.632212', '0.000000', '119.529719', '161512', '832', '', '');
-- run: rep=1 config=stock tag=cost-stock-1 wall_s=7.759 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:43Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '120.033142', '0.000000', '612.026300', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:46Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.895717', '0.000000', '265.101677', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:48Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1283.492788', '0.000000', '120.008346', '161512', '832', '', '');
-- run: rep=1 config=cublas tag=cost-cublas-1 wall_s=7.421 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:51Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '275.410296', '0.000000', '266.741807', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:53Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '321.397579', '0.000000', '278.710006', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:56Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '515.217788', '0.000000', '298.960652', '161512', '2080', '', '');
-- run: rep=1 config=mmq tag=cost-mmq-1 wall_s=7.090 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:41:58Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.389450', '0.000000', '615.326063', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:00Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.823091', '0.000000', '265.158669', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:03Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1285.882212', '0.000000', '119.785346', '161512', '832', '', '');
-- run: rep=2 config=stock tag=cost-stock-2 wall_s=7.263 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:05Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.855619', '0.000000', '612.932797', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:08Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.682185', '0.000000', '265.269313', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:10Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1287.329327', '0.000000', '119.650693', '161512', '832', '', '');
-- run: rep=2 config=cublas tag=cost-cublas-2 wall_s=7.483 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:13Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '275.783384', '0.000000', '266.380950', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:15Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '321.583489', '0.000000', '278.548882', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:17Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '514.756250', '0.000000', '299.228705', '161512', '2080', '', '');
-- run: rep=2 config=mmq tag=cost-mmq-2 wall_s=7.743 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:20Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.733257', '0.000000', '613.559189', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:23Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '339.214773', '0.000000', '264.070814', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:25Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1287.406250', '0.000000', '119.643544', '161512', '832', '', '');
-- run: rep=3 config=stock tag=cost-stock-3 wall_s=7.819 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:28Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.723050', '0.000000', '613.611495', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:31Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '339.845438', '0.000000', '263.580767', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:33Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1283.712740', '0.000000', '119.987783', '161512', '832', '', '');
-- run: rep=3 config=cublas tag=cost-cublas-3 wall_s=7.389 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:36Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '273.569572', '0.000000', '268.536590', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:38Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '321.567970', '0.000000', '278.562324', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:40Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '513.275481', '0.000000', '300.091962', '161512', '2080', '', '');
-- run: rep=3 config=mmq tag=cost-mmq-3 wall_s=7.023 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:43Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.822821', '0.000000', '613.100570', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:45Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.889510', '0.000000', '265.106547', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:47Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1286.663462', '0.000000', '119.712614', '161512', '832', '', '');
-- run: rep=4 config=stock tag=cost-stock-4 wall_s=7.499 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:50Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.691514', '0.000000', '613.773171', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:53Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '337.812228', '0.000000', '265.167195', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:55Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1287.372596', '0.000000', '119.646672', '161512', '832', '', '');
-- run: rep=4 config=cublas tag=cost-cublas-4 wall_s=7.367 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:42:58Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '275.097604', '0.000000', '267.045001', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:00Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '321.111421', '0.000000', '278.958378', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:02Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '514.064904', '0.000000', '299.631126', '161512', '2080', '', '');
-- run: rep=4 config=mmq tag=cost-mmq-4 wall_s=7.400 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:05Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.215138', '0.000000', '616.225770', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:07Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '340.443203', '0.000000', '263.117960', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:10Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1291.128606', '0.000000', '119.298609', '161512', '832', '', '');
-- run: rep=5 config=stock tag=cost-stock-5 wall_s=7.807 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:13Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.794610', '0.000000', '613.244952', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:15Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '340.340782', '0.000000', '263.197142', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:17Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1287.093750', '0.000000', '119.672593', '161512', '832', '', '');
-- run: rep=5 config=cublas tag=cost-cublas-5 wall_s=8.032 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:20Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '275.790010', '0.000000', '266.374550', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:23Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '322.265673', '0.000000', '277.959238', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:25Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '515.422115', '0.000000', '298.842137', '161512', '2080', '', '');
-- run: rep=5 config=mmq tag=cost-mmq-5 wall_s=7.742 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:29Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.940940', '0.000000', '612.496781', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:31Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '340.421167', '0.000000', '263.134992', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:33Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1288.931490', '0.000000', '119.501965', '161512', '832', '', '');
-- run: rep=6 config=stock tag=cost-stock-6 wall_s=7.571 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:36Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '120.092775', '0.000000', '611.722394', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:39Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '339.454376', '0.000000', '263.884420', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:41Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1288.748798', '0.000000', '119.518906', '161512', '832', '', '');
-- run: rep=6 config=cublas tag=cost-cublas-6 wall_s=7.843 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:44Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '276.127421', '0.000000', '266.049057', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:46Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '322.222222', '0.000000', '277.996721', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:49Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '515.070673', '0.000000', '299.046042', '161512', '2080', '', '');
-- run: rep=6 config=mmq tag=cost-mmq-6 wall_s=7.398 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:52Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.721330', '0.000000', '613.620311', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:54Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '338.515518', '0.000000', '264.616292', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:56Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1286.865385', '0.000000', '119.693830', '161512', '832', '', '');
-- run: rep=7 config=stock tag=cost-stock-7 wall_s=7.134 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:43:59Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '119.781078', '0.000000', '613.314233', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:01Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '339.310366', '0.000000', '263.996418', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:03Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1288.932692', '0.000000', '119.501854', '161512', '832', '', '');
-- run: rep=7 config=cublas tag=cost-cublas-7 wall_s=7.507 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:06Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '275.477319', '0.000000', '266.676909', '77032', '3924', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:08Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '321.816884', '0.000000', '278.346866', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:11Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '516.561058', '0.000000', '298.183233', '161512', '2080', '', '');
-- run: rep=7 config=mmq tag=cost-mmq-7 wall_s=7.465 cases=3 rc=0
CREATE TABLE IF NOT EXISTS test_backend_ops (
  test_time TEXT,
  build_commit TEXT,
  backend_name TEXT,
  op_name TEXT,
  op_params TEXT,
  test_mode TEXT,
  supported INTEGER,
  passed INTEGER,
  error_message TEXT,
  time_us REAL,
  flops REAL,
  bandwidth_gb_s REAL,
  memory_kb INTEGER,
  n_runs INTEGER,
  device_description TEXT,
  backend_reg_name TEXT
);

INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:13Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M64,type=f32,ne=[17408,64,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,64,1,1]', 'perf', '1', '1', '', '120.069610', '0.000000', '611.840414', '77032', '8720', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:16Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M256,type=f32,ne=[17408,256,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,256,1,1]', 'perf', '1', '1', '', '338.130043', '0.000000', '264.917960', '93928', '3222', '', '');
INSERT INTO test_backend_ops (test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name) VALUES ('2026-11-30T12:44:18Z', 'e86f4e1', 'CUDA0', 'MUL_MAT', 'name=q6_K:N17408:K5120:M1024,type=f32,ne=[17408,1024,1,1],op_params=[],sources=q6_K[5120,17408,1,1],f32[5120,1024,1,1]', 'perf', '1', '1', '', '1288.662260', '0.000000', '119.526932', '161512', '832', '', '');
