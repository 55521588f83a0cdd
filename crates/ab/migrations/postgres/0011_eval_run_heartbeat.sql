-- A running eval run's process writes its heartbeat every few seconds; a run left `running`
-- whose heartbeat stopped (its server stopped during it) reads as `interrupted`.
ALTER TABLE eval_runs ADD COLUMN heartbeat DOUBLE PRECISION;
