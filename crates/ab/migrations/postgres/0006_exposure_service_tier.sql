-- Priority classes (issue 44): the class a routed request ran in (interactive, fanout, batch).
ALTER TABLE exposures ADD COLUMN IF NOT EXISTS service_tier TEXT;
