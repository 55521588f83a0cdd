-- Whose request an exposure was (issue 45): the name of the API key that sent it (`--keys`,
-- `api-key` for `--api-key`), so that an inference key posts outcome events only for the units
-- its own requests were served for.
ALTER TABLE exposures ADD COLUMN caller TEXT;
CREATE INDEX IF NOT EXISTS exposures_by_caller ON exposures (experiment, caller, unit);
