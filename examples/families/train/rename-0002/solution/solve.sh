#!/bin/bash
mv values.txt summary.txt
