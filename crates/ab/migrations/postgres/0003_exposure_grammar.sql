-- Structured outputs: whether an exposure's answer was constrained by a grammar
-- (response_format or tools) and, when it was, whether it finished as a complete match.
ALTER TABLE exposures ADD COLUMN IF NOT EXISTS constrained BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE exposures ADD COLUMN IF NOT EXISTS grammar_complete BOOLEAN;
