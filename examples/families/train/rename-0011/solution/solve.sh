#!/bin/bash
mv data.txt summary.txt
