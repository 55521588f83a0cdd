-- Models served elsewhere (issue 43): the prompt tokens an exposure's answer took and what it
-- cost at its model's configured prices (NULL: no prices, or no answer).
ALTER TABLE exposures ADD COLUMN IF NOT EXISTS prompt_tokens BIGINT;
ALTER TABLE exposures ADD COLUMN IF NOT EXISTS cost DOUBLE PRECISION;
